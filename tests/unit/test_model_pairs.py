"""Preference pairs from a model's own samples (``flowrl.data.pairs.pairs_from_samples``)."""

import pytest

from flowrl.data.pairs import pairs_from_samples


def test_a_pair_per_prompt_with_a_right_and_a_wrong_answer():
    prompts = [[{"role": "user", "content": "1+1="}], [{"role": "user", "content": "2+2="}],
               [{"role": "user", "content": "3+3="}], [{"role": "user", "content": "4+4="}]]
    answers = [["3", "2", "2", "1"], ["4", "4"], ["5", "7"], []]
    scores = [[0.0, 1.0, 1.0, 0.0], [1.0, 1.0], [0.0, 0.0], []]
    # prompt 0: the first right answer "2" over the first wrong one "3"; prompts 1 (all right),
    # 2 (all wrong) and 3 (no answers) give none
    assert pairs_from_samples(prompts, answers, scores) == [{"prompt": prompts[0], "chosen": "2", "rejected": "3"}]
    # graded scores: the best over the worst
    assert pairs_from_samples(["p"], [["a", "b", "c"]], [[0.5, 0.9, 0.1]]) == [
        {"prompt": "p", "chosen": "b", "rejected": "c"}]


def test_several_distinct_wrong_answers_per_prompt():
    # right "4" (the first right one) against each distinct wrong answer, in sample order: "5", "x" ("5" once)
    got = pairs_from_samples(["p"], [["5", "4", "5", "x", "4"]], [[0.0, 1.0, 0.0, 0.0, 1.0]], max_pairs_per_prompt=3)
    assert [(r["chosen"], r["rejected"]) for r in got] == [("4", "5"), ("4", "x")]
    got = pairs_from_samples(["p"], [["5", "4", "6", "x"]], [[0.0, 1.0, 0.0, 0.0]], max_pairs_per_prompt=2)
    assert [(r["chosen"], r["rejected"]) for r in got] == [("4", "5"), ("4", "6")]
    with pytest.raises(ValueError, match="max_pairs_per_prompt=0"):
        pairs_from_samples(["p"], [["a"]], [[1.0]], max_pairs_per_prompt=0)


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="2 prompts, 1 answer lists and 1 score lists"):
        pairs_from_samples(["p", "q"], [["a"]], [[1.0]])
    with pytest.raises(ValueError, match="2 answers but 1 scores"):
        pairs_from_samples(["p"], [["a", "b"]], [[1.0]])

"""The embedded code task (issue 38): prompts and tests, the taught one-liner passing its own
tests in the jail, and a (very short) build that round-trips through AutoTokenizer."""

from __future__ import annotations

import json

import pytest

from flowrl.agents.jail import jail_problem
from flowrl.tasks.code_task import DATA_SOURCE, CodeTask, make_rows, prepare_code_task, solution


def test_rows_are_disjoint_between_splits_and_carry_verls_call_based_tests():
    train, test = make_rows(300, 0, "train"), make_rows(40, 0, "test")
    assert make_rows(300, 0, "train") == train
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in test}
    row = train[0]
    tests = json.loads(row["reward_model"]["ground_truth"])
    b, a_plus_b = (int(p.split("=")[1]) for p in row["prompt"][0]["content"].rstrip(":").split(","))
    assert tests["fn_name"] == "f" and tests["outputs"][:2] == [str(b), str(a_plus_b)]
    assert solution(2, -3) == "def f(x):return 2*x-3" and solution(4, 0) == "def f(x):return 4*x"
    assert len(row["prompt"][0]["content"]) <= 32 and row["data_source"] == DATA_SOURCE


@pytest.mark.skipif(jail_problem() is not None, reason=f"no jail here: {jail_problem()}")
def test_the_taught_solution_passes_and_a_wrong_slope_earns_the_intercept_only(monkeypatch):
    from flowrl.rewards import resolve_reward_fn

    monkeypatch.delenv("FLOWRL_SANDBOX", raising=False)
    score = resolve_reward_fn("auto")  # the task's data source is scored by the code reward
    row = make_rows(1, 3, "train")[0]
    truth, right = row["reward_model"]["ground_truth"], row["extra_info"]["solution"]
    assert score(DATA_SOURCE, right, truth)["score"] == 1.0
    wrong = right.replace("return ", "return 10*x+0*")  # same intercept, slope + 10
    assert score(DATA_SOURCE, wrong, truth)["score"] == pytest.approx(0.2)  # only f(0) passes
    assert score(DATA_SOURCE, "def f(x", truth) == {"score": 0.0, "tests_passed": 0.0, "compiled": 0.0}


def test_a_short_build_round_trips(tmp_path):
    from transformers import AutoTokenizer

    from flowrl.tasks.warmup import WarmupConfig

    warmup = WarmupConfig(max_steps=4, batch_size=8, check_every=10, target_greedy_accuracy=None)  # no probe
    task = prepare_code_task(tmp_path / "task", num_train=64, num_test=8, warmup=warmup)
    assert isinstance(task, CodeTask) and task.warmup_steps == 4 and task.train_path.exists()
    tok = AutoTokenizer.from_pretrained(task.model_dir)
    text = "def f(x):return 2*x-3"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text  # spaces survive loading
    assert prepare_code_task(tmp_path / "task", num_train=64, num_test=8, warmup=warmup) == task  # cached

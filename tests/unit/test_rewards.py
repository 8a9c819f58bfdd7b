"""Reward functions, checked by hand, and the registry lookups."""

import textwrap

import pytest

from flowrl.rewards import REWARD_FUNCTIONS, resolve_reward_fn, split_score
from flowrl.rewards.math import exact_match, extract_gsm8k_answer, gsm8k

ADD = "flowrl/addition"
GSM = "openai/gsm8k"


@pytest.mark.parametrize(
    "response, expected",
    [("85", 1.0), (" 85 ", 1.0), ("85\n", 1.0), ("58", 0.0), ("8", 0.0), ("850", 0.0), ("", 0.0)],
)
def test_exact_match(response, expected):
    assert exact_match(ADD, response, "85") == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        ("so the total is #### 1,234", 1.0),  # commas removed -> "1234"
        ("#### $1,234", 1.0),  # dollar sign removed
        ("#### 1234.", 1.0),  # sentence-final period ignored
        ("#### 12 then #### 1234", 1.0),  # the last answer counts
        ("the answer is 1234", 0.0),  # no #### -> 0
        ("#### 1235", 0.0),
        ("#### -1234", 0.0),
    ],
)
def test_gsm8k(response, expected):
    assert gsm8k(GSM, response, "1234") == expected


def test_gsm8k_extracts_none_without_marker():
    assert extract_gsm8k_answer("1234") is None
    assert extract_gsm8k_answer("#### -3") == "-3"


def test_builtin_names_registered():
    assert {"exact_match", "gsm8k", "auto"} <= set(REWARD_FUNCTIONS.names())
    assert resolve_reward_fn("exact_match") is exact_match


def test_auto_dispatches_by_data_source():
    auto = resolve_reward_fn("auto")
    assert auto(ADD, " 85 ", "85") == 1.0
    assert auto(ADD, "#### 85", "85") == 0.0  # exact match, not gsm8k
    assert auto(GSM, "#### 85", "85") == 1.0


def test_auto_unknown_data_source_lists_valid_ones():
    with pytest.raises(ValueError, match="my/data") as info:
        resolve_reward_fn("auto")("my/data", "1", "1")
    assert "flowrl/addition" in str(info.value) and "openai/gsm8k" in str(info.value)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown reward function 'nope'") as info:
        resolve_reward_fn("nope")
    assert "exact_match" in str(info.value) and "gsm8k" in str(info.value)


def test_user_module_function(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_mod.py").write_text(
        textwrap.dedent(
            """
            def my_score(data_source, solution_str, ground_truth, extra_info=None):
                return {"score": float(solution_str == ground_truth), "length": len(solution_str)}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = resolve_reward_fn("my_rewards_mod:my_score")
    assert split_score(fn(ADD, "85", "85")) == (1.0, {"length": 2.0})
    with pytest.raises(ValueError, match="no attribute"):
        resolve_reward_fn("my_rewards_mod:missing")


def test_split_score():
    assert split_score(0.5) == (0.5, {})
    assert split_score({"score": 1, "acc": True}) == (1.0, {"acc": 1.0})
    with pytest.raises(ValueError, match="'score'"):
        split_score({"acc": 1.0})

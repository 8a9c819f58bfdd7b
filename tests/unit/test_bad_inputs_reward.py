"""A reward function that misbehaves ends the run with one named error (issue 35, item 9): it
raises, exits, hangs, has the wrong signature, or returns no finite number (None, a list, a
word, the string "1.0", NaN, +-inf). The error names the function, the row (its place in the
batch, data_source and verl's extra_info.index) and the fix; the CLI prints it as one ``error:``
line with exit 1. The reward node runs here with a stand-in tokenizer (no model, no worker)."""

from __future__ import annotations

import json
import math
import sys
import textwrap
import time
import types

import pyarrow as pa
import pytest

from flowrl.nodes import rewards as reward_nodes
from flowrl.rewards import resolve_reward_fn, split_score
from flowrl.rewards.registry import RewardFunctionError

MODULE = "flowrl_bad_reward_mod"


class _Tokenizer:
    """Decodes ids as their digits ("response" [1, 2] -> "12")."""

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(str(i) for i in row) for row in ids]


@pytest.fixture
def bad_rewards(monkeypatch, tmp_path):
    """A module of misbehaving reward functions, importable as MODULE; the stand-in tokenizer."""
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent("""
        import math, sys, time

        def raises(data_source, solution_str, ground_truth, extra_info=None):
            raise ValueError("cannot parse " + solution_str)
        def none(data_source, solution_str, ground_truth, extra_info=None):
            return None
        def a_list(data_source, solution_str, ground_truth, extra_info=None):
            return [1.0]
        def word(data_source, solution_str, ground_truth, extra_info=None):
            return "correct"
        def string_one(data_source, solution_str, ground_truth, extra_info=None):
            return "1.0"
        def nan(data_source, solution_str, ground_truth, extra_info=None):
            return {"score": math.nan}
        def inf(data_source, solution_str, ground_truth, extra_info=None):
            return -math.inf
        def exits(data_source, solution_str, ground_truth, extra_info=None):
            sys.exit(0)
        def hangs(data_source, solution_str, ground_truth, extra_info=None):
            time.sleep(30)
        def two_args(solution, truth):
            return 1.0
        def good(data_source, solution_str, ground_truth, extra_info=None):
            return {"score": float(solution_str == ground_truth), "pred": solution_str, "acc": True}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(reward_nodes, "load_tokenizer", lambda _: _Tokenizer())
    yield
    sys.modules.pop(MODULE, None)


def _batch(n: int = 3) -> pa.Table:
    return pa.table({
        "response_ids": pa.array([[1, 2]] * n, pa.list_(pa.int32())),
        "data_source": ["gsm8k"] * n,
        "ground_truth": ["12"] * n,
        "extra_info": [json.dumps({"index": 40 + i}) for i in range(n)],
    })


@pytest.mark.parametrize(("fn", "problem", "fix"), [
    ("raises", "raised ValueError: cannot parse 12", "fix the function"),
    ("none", "returned None (NoneType)", "must be a number"),
    ("a_list", "returned [1.0] (list)", "must be a number"),
    ("word", "returned 'correct' (str)", "must be a number"),
    ("string_one", "returned '1.0' (str)", "float()"),
    ("nan", "returned the score nan", "return a finite number"),
    ("inf", "returned the score -inf", "return a finite number"),
    ("exits", "called sys.exit(0)", "never exits"),
])
def test_bad_reward_is_named(bad_rewards, fn, problem, fix):
    with pytest.raises(RewardFunctionError) as info:
        reward_nodes.reward(_batch(), "tok", f"{MODULE}:{fn}")
    message = str(info.value)
    for part in (f"'{MODULE}:{fn}'", "row 0 of the batch (data_source='gsm8k', index=40)", problem, fix):
        assert part in message, (part, message)


def test_hanging_reward_times_out(bad_rewards):
    start = time.perf_counter()
    with pytest.raises(RewardFunctionError, match=r"within reward_model.reward_timeout_s=0.2s \(still on row 0 "
                                                  r"of the batch \(data_source='gsm8k', index=40\)\)"):
        reward_nodes.reward(_batch(), "tok", f"{MODULE}:hangs", timeout_s=0.2)
    assert time.perf_counter() - start < 2.0


def test_wrong_signature_refused_when_resolved(bad_rewards):
    # pre-flight resolves the function (flowrl.run.preflight.check_reward_fn): a ConfigError, exit 2
    with pytest.raises(TypeError, match=r"has the signature \(solution, truth\).*def compute_score\(data_source"):
        resolve_reward_fn(f"{MODULE}:two_args")


def test_good_reward_keeps_numeric_extras(bad_rewards):
    out = reward_nodes.reward(_batch(2), "tok", f"{MODULE}:good")
    assert out.value.column("score").to_pylist() == [1.0, 1.0]
    assert out.metrics == {"reward/acc": 1.0}  # "pred" (a string) is no metric


def test_split_score_numbers():
    import numpy as np

    assert split_score(np.float32(0.5)) == (0.5, {})
    assert split_score(True) == (1.0, {})
    for bad in ("1.0", None, [1.0], math.nan, math.inf, {"score": "1"}):
        with pytest.raises(ValueError):
            split_score(bad)


def test_cli_prints_one_error_line(capsys, monkeypatch):
    """A run that fails in a graph node with a RewardFunctionError (here: raised by train) exits 1
    with one ``error:`` line, wrapped or not."""
    import flowrl.cli as cli

    error = RewardFunctionError("reward function 'm:f' returned None (NoneType) on row 0 ...")

    def fail(args):
        try:
            raise error
        except RewardFunctionError as exc:
            raise RuntimeError("graph node reward-000001 failed") from exc

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(parser, fail))
    assert cli.main(["train"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {error}"]


def _with_func(parser, func):
    real = parser.parse_args
    parser.parse_args = lambda argv=None: types.SimpleNamespace(**{**vars(real(argv)), "func": func})
    return parser

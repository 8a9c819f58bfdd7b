"""The end-of-run summary line: the first and last steps it compares never overlap."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from flowrl.metrics import names
from flowrl.run.loop import _summary


def _history(scores: list[float]) -> list[dict[str, float]]:
    return [{names.SCORE_MEAN: s, names.NUM_RESPONSE_TOKENS: 10.0, names.STEP_TIME: 1.0} for s in scores]


def test_a_long_run_compares_its_first_and_last_five_steps():
    summary = _summary(SimpleNamespace(run_dir=Path("r")), _history([0.0] * 5 + [0.5] * 10 + [1.0] * 5), 9.0, 0)
    assert (summary.window, summary.first_score, summary.last_score) == (5, 0.0, 1.0)
    assert "first 5 steps 0.000 -> last 5 steps 1.000 (+1.000)" in summary.text()
    assert summary.tokens_per_s == 10.0


def test_a_short_run_compares_halves_and_one_step_compares_nothing():
    five = _summary(SimpleNamespace(run_dir=Path("r")), _history([0.1, 0.2, 0.3, 0.4, 0.5]), 1.0, 0)
    # 5 steps: the first 2 against the last 2, not the same 5 steps against themselves
    assert five.window == 2 and abs(five.first_score - 0.15) < 1e-12 and abs(five.last_score - 0.45) < 1e-12
    assert "first 2 steps 0.150 -> last 2 steps 0.450" in five.text()
    one = _summary(SimpleNamespace(run_dir=Path("r")), _history([0.25]), 1.0, 0)
    assert "mean score 0.250 |" in one.text() and "->" not in one.text()

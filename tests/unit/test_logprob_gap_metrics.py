"""The engine/trainer log-prob gap a step reports (``rollout/logprob_diff_{max,p99,mean}``):
over every response token of the batch, from the table's ``rollout_logprobs`` (the engine's) and
``old_logprobs`` (the trainer's)."""

import numpy as np
import pyarrow as pa
import pytest

from flowrl.metrics import names
from flowrl.nodes.results import data_metrics


def _table(rollout: list[list[float]], old: list[list[float]]) -> pa.Table:
    n = len(rollout)
    return pa.table({
        "score": pa.array([0.0] * n, pa.float32()),
        "prompt_ids": pa.array([[1, 2]] * n, pa.list_(pa.int32())),
        "response_ids": pa.array([[3] * len(r) for r in rollout], pa.list_(pa.int32())),
        "rollout_logprobs": pa.array(rollout, pa.list_(pa.float32())),
        "old_logprobs": pa.array(old, pa.list_(pa.float32())),
    })


def test_the_gap_is_over_every_token_of_every_row():
    rng = np.random.default_rng(0)
    old = [list(-rng.random(k)) for k in (3, 1, 5, 100)]
    gaps = [list(rng.random(len(r)) * 1e-6) for r in old]
    gaps[2][4] = 3e-3  # one outlying token, in a middle row
    rollout = [[o + g for o, g in zip(ro, rg)] for ro, rg in zip(old, gaps)]
    out = data_metrics(_table(rollout, old))
    # what the table holds (float32), token by token
    flat = np.abs(np.concatenate([np.float32(r) for r in rollout]).astype(np.float64)
                  - np.concatenate([np.float32(r) for r in old]).astype(np.float64))
    assert out[names.ROLLOUT_LOGPROB_DIFF_MAX] == pytest.approx(3e-3, rel=1e-3)
    assert out[names.ROLLOUT_LOGPROB_DIFF_MEAN] == pytest.approx(flat.mean())
    assert out[names.ROLLOUT_LOGPROB_DIFF_P99] == pytest.approx(np.quantile(flat, 0.99))
    assert out[names.ROLLOUT_LOGPROB_DIFF_P99] < 1e-4  # the one outlier is the max, not the bulk


def test_no_gap_metrics_without_both_columns():
    table = _table([[-1.0]], [[-1.0]]).drop_columns(["old_logprobs"])
    out = data_metrics(table)
    assert not any(k.startswith("rollout/logprob_diff") for k in out)

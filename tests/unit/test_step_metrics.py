"""verl's whole-batch metrics (issue 35, item 7), computed as ``verl/trainer/ppo/metric_utils.py``
computes them, on a hand-made experience table."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flowrl.data import experience
from flowrl.metrics import names
from flowrl.run.step_metrics import batch_metrics, driver_metrics, per_token_timings


def _table() -> pa.Table:
    # 3 samples: prompts of 4, 2, 4 tokens (data.max_prompt_length=4); responses of 3, 0, 2
    # tokens (rollout.response_length=3); the second was aborted (no response)
    floats = experience.TOKEN_FLOATS
    return pa.table({
        "prompt_ids": pa.array([[1, 2, 3, 4], [1, 2], [5, 6, 7, 8]], experience.TOKEN_IDS),
        "response_ids": pa.array([[9, 9, 9], [], [9, 9]], experience.TOKEN_IDS),
        "token_rewards": experience.from_lists([[0.0, -0.25, 1.0], [], [0.5, 0.0]], floats),
        "returns": experience.from_lists([[2.0, 1.0, -1.0], [], [4.0, 8.0]], floats),
        "response_mask": experience.from_lists([[1, 1, 0], [], [1, 1]], floats),
    })


def test_batch_metrics_are_verls():
    out = batch_metrics(_table(), max_prompt_length=4, max_response_length=3)
    assert out[names.PROMPT_LENGTH_MAX] == 4 and out[names.PROMPT_LENGTH_MIN] == 2
    assert out[names.PROMPT_LENGTH_CLIP_RATIO] == pytest.approx(2 / 3)  # two prompts at the limit
    assert out[names.RESPONSE_LENGTH_CLIP_RATIO] == pytest.approx(1 / 3)  # one response of 3 tokens
    # rewards: per-sample sums 0.75 and 0.5 (the aborted sample left out, as verl does)
    assert (out[names.REWARDS_MEAN], out[names.REWARDS_MAX], out[names.REWARDS_MIN]) == pytest.approx((0.625, 0.75, 0.5))
    # returns over masked-in tokens: 2, 1, 4, 8 (the -1 has mask 0)
    assert (out[names.RETURNS_MEAN], out[names.RETURNS_MAX], out[names.RETURNS_MIN]) == pytest.approx((3.75, 8.0, 1.0))


def test_a_table_without_the_columns_gets_only_what_it_has():
    table = _table().drop_columns(["token_rewards", "returns"])
    out = batch_metrics(table, max_prompt_length=4, max_response_length=3)
    assert names.REWARDS_MEAN not in out and names.RETURNS_MEAN not in out
    assert names.RESPONSE_LENGTH_CLIP_RATIO in out


def test_per_token_timings_use_verls_token_counts():
    metrics = {names.timing("gen"): 0.5, names.timing("update_actor"): 2.0, names.timing("reward"): 1.0}
    out = per_token_timings(metrics, num_response_tokens=250.0, num_tokens=1000.0)
    # gen over response tokens: 500 ms / 250; update_actor over all tokens: 2000 ms / 1000; reward: not verl's
    assert out == {names.timing_per_token("gen"): 2.0, names.timing_per_token("update_actor"): 2.0}
    assert per_token_timings(metrics, 0.0, 0.0)[names.timing_per_token("gen")] == 0.0


def test_driver_metrics_number_steps_and_epochs_as_verl():
    first = driver_metrics(0, 2.0, 1000.0, steps_per_epoch=4)
    assert first[names.GLOBAL_STEP] == 1.0 and first[names.EPOCH] == 0.0
    assert first[names.TOTAL_NUM_TOKENS] == 1000.0 and first[names.THROUGHPUT] == 500.0
    assert driver_metrics(3, 1.0, 1.0, 4)[names.EPOCH] == 0.0  # the 4th batch of the first pass
    assert driver_metrics(4, 1.0, 1.0, 4)[names.EPOCH] == 1.0

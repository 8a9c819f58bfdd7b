"""Issue 28: the critic's and the reward model's new head is the same at every backend without a
whole-model load: ``value_head.new_head`` of the seed. A freshly built value model (the PPO
critic) and reward model give the same initial values at dp, at FSDP2 over 2 ranks (built on the
meta device, each rank reading only its rows) and at megatron TP2 (each rank reading only its
shard of the safetensors), within 1e-5; another seed gives another head."""

from __future__ import annotations

import pytest

from flowrl_testing.fsdp import run_ranks
from flowrl_testing.post_training import pair_batch
from flowrl_testing.value_heads import REWARD, VALUE, initial_values


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", [VALUE, REWARD])
def test_new_heads_give_the_same_initial_values_at_dp_fsdp_and_megatron_tp2(tiny_model_dir, kind):
    import numpy as np

    model, table = str(tiny_model_dir), pair_batch(num_pairs=3)
    dp = initial_values(0, 1, model, kind, "dp", table, 5)["values"].numpy()
    other = initial_values(0, 1, model, kind, "dp", table, 6)["values"].numpy()
    assert np.abs(dp - other).max() > 1e-3  # the head is the seed's
    fsdp = run_ranks(2, initial_values, model, kind, "fsdp", table, 5, timeout_s=300)
    assert all(r["meta"] for r in fsdp)
    for r in fsdp:
        assert r["values"].numpy() == pytest.approx(dp, abs=1e-5)
    pytest.importorskip("megatron.core")
    megatron = run_ranks(2, initial_values, model, kind, "megatron", table, 5, 2, timeout_s=300)
    total = sum(p.stat().st_size for p in tiny_model_dir.glob("*.safetensors"))
    for r in megatron:
        assert r["values"].numpy() == pytest.approx(dp, abs=1e-5)
        assert r["bytes_read"] is not None and r["bytes_read"] < total  # its shard, not the model

"""Sharded megatron checkpoints of the tiny Qwen3-MoE under expert parallelism (4 gloo ranks):
saved at EP 2 x TP 2 after one step (each shard key's first rank writes its experts' slices,
under their global indices), resumed at EP 1 x DP 4 (every rank all four experts) and from there
at EP 2 x PP 2 (etp 1); each re-save right after loading equals the original bitwise
(parameters, exp_avg, exp_avg_sq, fp32)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("megatron.core")


@pytest.mark.timeout(900)
def test_ep2_tp2_checkpoint_resumes_at_ep1_dp4_bitwise(tmp_path):
    from flowrl.comm import free_port
    from flowrl_testing import megatron as testing
    from flowrl_testing import megatron_moe_checkpoint as worker
    from flowrl_testing.megatron_moe import make_tiny_moe

    model_dir = str(tmp_path / "model")
    make_tiny_moe(model_dir)
    out = tmp_path / "out.json"
    testing.spawn(worker.resume_worker, world_size=4,
                  args=(free_port(), model_dir, str(tmp_path / "ckpt"), str(out)), timeout_s=840)
    r = json.loads(out.read_text())
    assert r["saved_optim_step"] == 1
    assert r["experts_with_state"] == r["expert_tensors"] == 2 * 4 * 3  # 2 layers, 4 experts, 3 weights
    for name in worker.TARGETS:
        assert r[name] == {"optim_step": 1, "resaved_bitwise": True}, (name, r[name])

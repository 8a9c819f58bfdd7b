"""The reshard transport moves experts: megatron EP x TP shards (SequentialMLP experts under local
indices) into the ``hf`` generation layout (transformers 5's fused ``experts.gate_up_proj`` /
``down_proj``, one expert per leading index) and vLLM's FusedMoE tensors, every process a thread
over an in-process group; every destination element equals the synthetic model bit for bit, and
the bytes sent equal the plan's minimum. ``job_for_run`` takes the actor's expert parallelism."""

from __future__ import annotations

import pytest
import torch
from test_reshard_devices import _check_exact, _run_threads

from flowrl.backends.reshard.job import job_for_run, make_job
from flowrl.comm import JointSpec
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape

SHAPE = ModelShape(vocab_size=61, hidden_size=16, ffn_hidden_size=32, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=4, num_experts=4, experts_per_token=2,
                   moe_ffn_hidden_size=8, qk_norm=True, tied_embeddings=True)

CASES = {  # source dims, destination dims, placement, destination style
    "EP2xTP2 -> hf DP4 colocated": (dict(dp=2, tp=2, pp=1, ep=2), dict(dp=4, tp=1, pp=1), "colocated", "hf"),
    "EP2xPP2 -> hf TP1 split": (dict(dp=2, tp=1, pp=2, ep=2), dict(dp=1, tp=1, pp=1), "split", "hf"),
    "EP2xPP2 -> vllm TP4 EP4 colocated": (dict(dp=2, tp=1, pp=2, ep=2), dict(dp=1, tp=4, pp=1, ep=4, etp=1),
                                      "colocated", "vllm"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("bucket", [None, 512])
def test_experts_arrive_bit_for_bit_with_minimum_bytes(case, bucket):
    src, dst, placement, style = CASES[case]
    src, dst = ParallelDims(**src), ParallelDims(**dst)
    joint = JointSpec("unused", "", 0, src.world_size + dst.world_size) if placement == "split" else None
    job = make_job(SHAPE, src=src, dst=dst, placement=placement, dst_style=style, bucket_bytes=bucket,
                   wire_dtype="float32", make_vocab_size_divisible_by=4, joint=joint)
    results = _run_threads(job)
    _check_exact(job, results)
    sent = sum(stats["bytes_sent"] for stats, *_ in results.values())
    assert sent == job.summary().bytes_min == sum(stats["bytes_min"] for stats, *_ in results.values())
    assert sent > 0


def test_job_for_run_takes_the_actors_expert_parallelism(tmp_path):
    from flowrl.config import load_config
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, tiny_preset

    build_tiny_model(build_char_tokenizer(), **tiny_preset("moe")).save_pretrained(tmp_path)
    cfg = load_config(None, [f"model.path={tmp_path}", "actor.strategy=megatron",
                             "actor.data_parallel_size=2", "actor.tensor_model_parallel_size=2",
                             "actor.megatron.expert_model_parallel_size=2", "rollout.data_parallel_size=1"])
    job = job_for_run(cfg)
    assert (job.src_dims.ep, job.src_dims.expert_tp) == (2, 2)
    src, dst = job.specs()
    # rank 1: tp rank 1, expert rank 0: global experts 0 and 1 (local 0, 1), half of each
    local = src.shard_of(1).tensors
    assert local["decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"] == (64, 64)
    assert "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight" not in local
    assert dst.shard_of(0).tensors["model.layers.0.mlp.experts.gate_up_proj"] == (4, 128, 64)
    assert job.summary().redundant_bytes == 0 and torch.float32.is_floating_point

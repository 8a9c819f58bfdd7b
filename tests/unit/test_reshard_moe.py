"""The reshard planner with experts (pure): training EP x TP x PP layouts to generation layouts
in every style, executed in numpy (indexed pieces of fused expert tensors included): every
destination shard equals the reference slices bit for bit, bytes sent == the minimum, each
process's own plan is its part of the whole plan, and the summary agrees at 1,024 ranks."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.reshard_plan import (
    Placement,
    ReshardIndex,
    micro_dp_placement,
    plan_for_rank,
    plan_reshard,
    plan_summary,
)
from flowrl.parallel.shard_spec import ModelShape, piece_index, shard_arrays, shard_spec

SHAPE = ModelShape(vocab_size=37, hidden_size=4, ffn_hidden_size=16, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=1, tied_embeddings=False, num_experts=8,
                   experts_per_token=2, moe_ffn_hidden_size=4, qk_norm=True)


def _full(shape):
    out, base = {}, 1.0
    for name, s in shape.param_shapes().items():
        n = math.prod(s)
        out[name] = (base + np.arange(n, dtype=np.float64)).reshape(s)
        base += n
    return out


def _local(tensors, local, index):
    return tensors[local] if index is None else tensors[local][index]


def _execute_and_check(plan, full):
    src, dst = plan.src, plan.dst
    src_shards = {r: shard_arrays(src, full, src.key_of(r)) for r in range(src.dims.world_size)}
    out = {r: {n: np.zeros(s) for n, s in dst.shard_of(r).tensors.items()}
           for r in range(dst.dims.world_size)}
    writes = {r: {n: np.zeros(s, dtype=np.int64) for n, s in dst.shard_of(r).tensors.items()}
              for r in range(dst.dims.world_size)}
    for t in plan.transfers:
        lead = (slice(None),) * t.dim
        s_idx, d_idx = lead + (slice(t.src_offset, t.src_offset + t.length),), \
            lead + (slice(t.dst_offset, t.dst_offset + t.length),)
        piece = _local(src_shards[t.src_rank], t.src_local, t.src_index)[s_idx]
        _local(out[t.dst_rank], t.dst_local, t.dst_index)[d_idx] = piece
        _local(writes[t.dst_rank], t.dst_local, t.dst_index)[d_idx] += 1
        assert t.nbytes == piece.size * plan.bytes_per_element
    for r in range(dst.dims.world_size):
        key = dst.key_of(r)
        ref = shard_arrays(dst, full, key)
        covered = {n: np.zeros(s, dtype=np.int64) for n, s in dst.shards[key].tensors.items()}
        for p in dst.shards[key].pieces:
            covered[p.local][piece_index(p, local=True, ndim=len(dst.params[p.param]))] += 1
        for name in ref:
            assert np.array_equal(out[r][name], ref[name]), (r, name)
            assert np.array_equal(writes[r][name], covered[name]), (r, name)
    # the minimum by brute force: per destination process, needed elements it does not hold
    src_of = {proc: r for r, proc in enumerate(plan.placement.src)}

    def elements(spec, rank):
        return {(p.param, i) for p in spec.shard_of(rank).pieces for i in range(p.start, p.stop)}

    brute = 0
    for r, proc in enumerate(plan.placement.dst):
        have = elements(src, src_of[proc]) if proc in src_of else set()
        brute += sum(dst.slice_numel(param) for param, _ in elements(dst, r) - have)
    assert plan.bytes_sent == plan.bytes_min == brute * plan.bytes_per_element
    assert plan.redundant_bytes == 0


CASES = [  # (train dims, generation dims, style, placement)
    (dict(dp=4, tp=2, pp=2, ep=4), dict(dp=4, tp=4, pp=1, ep=2), "hf", "colocated"),
    (dict(dp=4, tp=2, pp=2, ep=4), dict(dp=4, tp=4, pp=1, ep=2), "megatron", "colocated"),
    (dict(dp=4, tp=2, pp=2, ep=4), dict(dp=4, tp=4, pp=1, ep=4, etp=1), "vllm", "colocated"),
    (dict(dp=2, tp=2, pp=1, ep=2), dict(dp=4, tp=1, pp=1), "hf", "colocated"),
    (dict(dp=4, tp=1, pp=2, ep=4, etp=1), dict(dp=2, tp=2, pp=1), "vllm", "split"),
    (dict(dp=2, tp=2, pp=2, ep=2, etp=1), dict(dp=2, tp=2, pp=1, ep=2, etp=2), "megatron", "split"),
    (dict(dp=2, tp=2, pp=1), dict(dp=4, tp=1, pp=1, ep=2), "hf", "colocated"),
    (dict(dp=8, tp=1, pp=1, ep=8), dict(dp=2, tp=4, pp=1, ep=8, etp=1), "vllm", "colocated"),
]


@pytest.mark.parametrize("train, gen, style, kind", CASES)
def test_expert_reshard_builds_reference_shards_with_minimum_bytes(train, gen, style, kind):
    src = shard_spec(SHAPE, ParallelDims(**train), make_vocab_size_divisible_by=4)
    dst = shard_spec(SHAPE, ParallelDims(**gen), style=style, make_vocab_size_divisible_by=4)
    placement = (micro_dp_placement(src, dst) if kind == "colocated"
                 else Placement.split(src.dims.world_size, dst.dims.world_size))
    plan = plan_reshard(src, dst, placement=placement)
    _execute_and_check(plan, _full(SHAPE))
    # megatron EP 8 (whole experts, full dense weights per rank) -> vLLM tp 4 with its EP over
    # tp x data-parallel ranks: every rank already holds its expert and its tp slices
    assert (plan.bytes_sent == 0) == (train == dict(dp=8, tp=1, pp=1, ep=8))
    # each process's own plan is exactly its part; the summary counts the same as the plan
    ix = ReshardIndex(src, dst)
    for process in placement.processes:
        mine = plan_for_rank(src, dst, placement=placement, process=process, index=ix)
        assert mine.transfers == tuple(t for t in plan.transfers
                                       if process in (t.src_process, t.dst_process))
        assert mine.bytes_received == plan.min_bytes_per_process.get(process, 0)
    fast = plan_summary(src, dst, placement=placement, index=ix)
    assert fast.summary() == plan.summary() and fast.rows == plan.stats().rows


def test_identical_expert_layouts_send_nothing():
    dims = ParallelDims(dp=4, tp=2, pp=1, ep=4, etp=1)
    src = shard_spec(SHAPE, dims, make_vocab_size_divisible_by=4)
    plan = plan_reshard(src, src, placement=Placement.colocated(dims.world_size))
    assert plan.bytes_sent == 0 and plan.transfers and all(t.local for t in plan.transfers)


def test_1024_ranks_summary_agrees_with_the_ranks_own_plans():
    # the issue's 5D example at 1,024 ranks: TP2 x EP4 x PP2 (dp 256) -> TP4 x EP2 (hf style)
    shape = ModelShape(vocab_size=512, hidden_size=8, ffn_hidden_size=32, num_layers=4,
                       num_heads=4, num_kv_heads=4, head_dim=2, num_experts=16,
                       experts_per_token=2, moe_ffn_hidden_size=8, qk_norm=True)
    sd = ParallelDims.from_world_size(1024, tp=2, pp=2, ep=4)
    dd = ParallelDims.from_world_size(1024, tp=4, ep=2)
    src, dst = shard_spec(shape, sd), shard_spec(shape, dd, style="hf")
    placement = micro_dp_placement(src, dst)
    ix = ReshardIndex(src, dst)
    stats = plan_summary(src, dst, placement=placement, index=ix)
    assert stats.bytes_sent == stats.bytes_min > 0 and stats.redundant_bytes == 0
    for process in (0, 1, 7, 255, 512, 1023):
        mine = plan_for_rank(src, dst, placement=placement, process=process, index=ix)
        row = stats.rows[process]
        assert row["send_bytes"] == sum(t.nbytes for t in mine.sends)
        assert row["num_sends"] == len(mine.sends)
        assert row["recv_bytes"] == mine.bytes_received == stats.min_bytes_per_process[process]
        assert row["num_local"] == len(mine.local_copies)


def test_cli_plans_the_issues_5d_example(tmp_path, capsys):
    import argparse

    from flowrl.parallel.reshard_cli import add_arguments, run

    config = {"model_type": "qwen3_moe", "vocab_size": 128, "hidden_size": 16,
              "intermediate_size": 64, "moe_intermediate_size": 8, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 4,
              "num_experts": 8, "num_experts_per_tok": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--train", "tp=2,ep=4,pp=2", "--gen", "tp=4,ep=2", "--model", str(tmp_path),
            "--gen-style", "hf"]
    assert run(parser.parse_args(argv)) == 0
    out = capsys.readouterr().out
    assert "dp=4,tp=2,pp=2,ep=4 (megatron) -> dp=4,tp=4,pp=1,ep=2 (hf), colocated, 16" in out
    assert "sent / minimum = 1.00" in out and "redundancy       0.00 MiB" in out
    assert "HybridFlow bound n/a" in out
    # vLLM's FusedMoE cannot hold etp=4 x ep=2: refused by name, with the fix
    assert run(parser.parse_args(argv[:-2])) == 2
    err = capsys.readouterr().err
    assert "vLLM's FusedMoE" in err and "ep=4,etp=1" in err

"""Bucketed reshard schedules (pure): executing local copies then rounds rebuilds the reference
destination shards bit for bit, no process stages more than one bucket in a round, and the
bytes on the wire are the plan's minimum. Plus the clear errors of bad jobs and engines."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowrl.comm import JointSpec
from flowrl.backends.reshard import ReshardJob, make_job
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.reshard_plan import Placement, plan_reshard
from flowrl.parallel.reshard_schedule import schedule_plan
from flowrl.parallel.shard_spec import ModelShape, shard_arrays, shard_spec

SHAPE = ModelShape(vocab_size=61, hidden_size=8, ffn_hidden_size=16, num_layers=4, num_heads=4,
                   num_kv_heads=2, head_dim=2, qkv_bias=True)
# (source layout, destination layout, destination style, placement)
PAIRS = [
    ((1, 2, 2), (4, 1, 1), "hf", "colocated"),  # TP2xPP2 -> TP1xDP4
    ((1, 4, 1), (2, 2, 1), "vllm", "colocated"),  # TP4 -> TP2xDP2: micro-DP groups {0,2}, {1,3}
    ((1, 2, 1), (2, 1, 1), "hf", "split"),  # TP2 -> two full models elsewhere
    ((2, 1, 2), (1, 2, 1), "megatron", "split"),
    ((2, 2, 1), (2, 2, 1), "vllm", "colocated"),  # same tp: mostly local
]


def _full(shape):
    out, base = {}, 1.0
    for name, s in shape.param_shapes().items():
        n = math.prod(s)
        out[name] = (base + np.arange(n, dtype=np.float64)).reshape(s)
        base += n
    return out


def _plan(pair, bpe=2):
    (sd, st_, sp), (dd, dt, dp_), style, placement = pair
    job = make_job(SHAPE, src=ParallelDims(dp=sd, tp=st_, pp=sp), dst=ParallelDims(dp=dd, tp=dt, pp=dp_),
                   placement=placement, dst_style=style, make_vocab_size_divisible_by=4,
                   joint=JointSpec("j", "", 0, 8) if placement == "split" else None,
                   wire_dtype="bfloat16" if bpe == 2 else "float32")
    return job.plan()


def _run(schedule, full):
    """Simulate a transport: local copies, then each round's messages packed flat and unpacked."""
    plan = schedule.plan
    src, dst = plan.src, plan.dst
    src_at = {proc: shard_arrays(src, full, src.dims.rank_coords(r)[1:]) for r, proc in enumerate(plan.placement.src)}
    out = {proc: {n: np.zeros(s) for n, s in dst.shard_of(r).tensors.items()} for r, proc in enumerate(plan.placement.dst)}

    def view(tensors, local, dim, offset, length):
        index = (slice(None),) * dim + (slice(offset, offset + length),)
        return tensors[local][index]

    for t in schedule.local:
        view(out[t.dst_process], t.dst_local, t.dim, t.dst_offset, t.length)[...] = view(
            src_at[t.src_process], t.src_local, t.dim, t.src_offset, t.length)
    for rnd in schedule.rounds:
        pairs = [(m.src_process, m.dst_process) for m in rnd.messages]
        assert len(pairs) == len(set(pairs))  # one message per pair per round
        for m in rnd.messages:
            flat = np.concatenate([view(src_at[m.src_process], t.src_local, t.dim, t.src_offset, t.length).ravel()
                                   for t in m.transfers])
            assert flat.size * plan.bytes_per_element == m.nbytes
            at = 0
            for t in m.transfers:
                v = view(out[m.dst_process], t.dst_local, t.dim, t.dst_offset, t.length)
                v[...] = flat[at:at + v.size].reshape(v.shape)
                at += v.size
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PAIRS), st.sampled_from([None, 64, 100, 1000, 10**6]))
def test_schedule_rebuilds_reference_within_the_bucket(pair, bucket):
    plan = _plan(pair)
    schedule = schedule_plan(plan, bucket_bytes=bucket)
    full = _full(SHAPE)
    out = _run(schedule, full)
    for r, proc in enumerate(plan.placement.dst):
        ref = shard_arrays(plan.dst, full, plan.dst.dims.rank_coords(r)[1:])
        for name in ref:
            assert np.array_equal(out[proc][name], ref[name]), (r, name)
    assert schedule.bytes_sent == plan.bytes_sent == plan.bytes_min
    procs = set(plan.placement.src) | set(plan.placement.dst)
    if bucket is None:
        assert len(schedule.rounds) <= 1
    else:
        assert all(schedule.staging_bytes(p) <= bucket for p in procs)


def test_bucket_bounds_rounds_and_staging():
    plan = _plan(PAIRS[0])
    # TP2xPP2 -> DP4 colocated: each process lacks 3/4 of the model (bf16)
    assert plan.bytes_min == 4 * plan.model_bytes * 3 // 4 or plan.bytes_min > 0
    one = schedule_plan(plan, bucket_bytes=None)
    small = schedule_plan(plan, bucket_bytes=256)
    assert len(one.rounds) == 1 and len(small.rounds) > 10
    assert max(small.staging_bytes(p) for p in range(4)) <= 256
    assert small.bytes_sent == one.bytes_sent == plan.bytes_min


def test_bucket_smaller_than_a_row_names_the_fix():
    plan = _plan(PAIRS[0])
    # a vocabulary row of the embedding: hidden 8 * 2 bytes = 16 bytes
    with pytest.raises(ValueError, match=r"bucket_bytes=8 is smaller than two rows of .* use bucket_bytes >= 32"):
        schedule_plan(plan, bucket_bytes=8)
    with pytest.raises(ValueError, match="bucket_bytes=-1 must be a positive integer"):
        schedule_plan(plan, bucket_bytes=-1)


def test_bad_jobs_fail_before_any_transfer():
    src, dst = ParallelDims(dp=1, tp=2, pp=2), ParallelDims(dp=4, tp=1, pp=1)
    with pytest.raises(ValueError, match="transport='gather' is unknown; use one of planned, naive"):
        make_job(SHAPE, src=src, dst=dst, transport="gather", make_vocab_size_divisible_by=4)
    # a placement that does not cover the destination layout's world
    with pytest.raises(ValueError, match="lists 3 destination processes but the destination layout has 4"):
        ReshardJob(model=SHAPE, src_dims=src, src_style="megatron", dst_dims=dst, dst_style="hf",
                   placement=Placement((0, 1, 2, 3), (0, 1, 2)))
    with pytest.raises(ValueError, match="split placement needs a joint process group"):
        make_job(SHAPE, src=src, dst=dst, placement="split", make_vocab_size_divisible_by=4)
    with pytest.raises(ValueError, match="same workers"):  # colocated needs equal worlds
        make_job(SHAPE, src=src, dst=ParallelDims(dp=2, tp=1, pp=1), make_vocab_size_divisible_by=4)
    with pytest.raises(ValueError, match="wire_dtype='float16'"):
        make_job(SHAPE, src=src, dst=dst, wire_dtype="float16", make_vocab_size_divisible_by=4)


def test_engine_tensors_that_do_not_match_the_plan_fail_clearly():
    torch = pytest.importorskip("torch")
    from flowrl.backends.reshard.exchange import check_tensors

    plan = _plan(PAIRS[0])
    tensors = {n: torch.zeros(s) for n, s in plan.dst.shard_of(0).tensors.items()}
    check_tensors(plan.dst, 0, tensors, "destination")
    tensors["model.norm.weight"] = torch.zeros(9)
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(9,\) but .* needs \(8,\); build the job"):
        check_tensors(plan.dst, 0, tensors, "destination")
    tensors["model.norm.weight"] = torch.zeros(8)
    del tensors["lm_head.weight"]
    with pytest.raises(ValueError, match="needs local tensor 'lm_head.weight', which its engine does not have"):
        check_tensors(plan.dst, 0, tensors, "destination")


def test_hf_style_at_tp1_is_the_state_dict_itself():
    spec = shard_spec(SHAPE, ParallelDims(dp=1, tp=1, pp=1), style="hf")
    shard = spec.shards[(0, 0)]
    assert shard.tensors == SHAPE.param_shapes()
    assert all(p.local == p.param and p.offset == 0 and p.start == 0 for p in shard.pieces)
    full = _full(SHAPE)
    for name, x in shard_arrays(spec, full, (0, 0)).items():
        assert np.array_equal(x, full[name])
    # tp=2: q heads split, o_proj by columns, vocabulary 61 padded to 62 rows
    spec2 = shard_spec(SHAPE, ParallelDims(dp=1, tp=2, pp=1), style="hf")
    s1 = spec2.shards[(1, 0)]
    assert s1.tensors["model.layers.0.self_attn.q_proj.weight"] == (4, 8)
    assert s1.tensors["model.layers.0.self_attn.o_proj.weight"] == (8, 4)
    assert s1.tensors["model.embed_tokens.weight"] == (31, 8)
    rows = shard_arrays(spec2, full, (1, 0))["model.embed_tokens.weight"]
    assert np.array_equal(rows[:30], full["model.embed_tokens.weight"][31:]) and not rows[30].any()

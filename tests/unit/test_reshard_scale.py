"""Per-rank reshard planning (pure, property-based): every process's own plan is exactly the whole
plan's restriction to it, the whole-plan summary (no transfer list) equals the counts of the
whole plan, each process's rounds agree with its peers' and with the whole schedule, and at
1,024 ranks the summary agrees with the ranks' own plans."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reshard_plan import _check, _full, cases

from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.reshard_plan import (
    Placement,
    ReshardIndex,
    micro_dp_placement,
    plan_for_rank,
    plan_reshard,
    plan_summary,
    process_min_bytes,
)
from flowrl.parallel.reshard_schedule import schedule_plan, schedule_rank
from flowrl.parallel.shard_spec import ModelShape, shard_spec


def _touches(t, process):
    return process in (t.src_process, t.dst_process)


def _reference_cuts(src, dst, placement):
    """What the previous planner (least-loaded sender) wrote, without its choice of sender: per
    destination rank, each destination piece cut at the source pieces' boundaries, a local copy
    where the process's own source shard holds the cut. Any balancing must write exactly this."""
    src_on = {proc: r for r, proc in enumerate(placement.src)}
    out = Counter()
    for r, proc in enumerate(placement.dst):
        mine = src_on.get(proc)
        held = src.shard_of(mine).pieces if mine is not None else ()
        for piece in dst.shard_of(r).pieces:
            bounds = {piece.start, piece.stop}
            for rank in range(src.dims.world_size):
                for p in src.shard_of(rank).pieces:
                    if p.param == piece.param:
                        bounds |= {x for x in (p.start, p.stop) if piece.start < x < piece.stop}
            cuts = sorted(bounds)
            for a, b in zip(cuts, cuts[1:]):
                local = any(p.param == piece.param and p.start <= a and b <= p.stop for p in held)
                out[(r, piece.param, a, b, local)] += 1
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_each_rank_plans_exactly_its_part_of_the_whole_plan(case):
    shape, src, dst, placement = case
    plan = plan_reshard(src, dst, placement=placement)
    ix = ReshardIndex(src, dst)
    for process in placement.processes:
        mine = plan_for_rank(src, dst, placement=placement, process=process, index=ix)
        # the same transfers, in the same order
        assert mine.transfers == tuple(t for t in plan.transfers if _touches(t, process))
        assert mine.bytes_received == plan.min_bytes_per_process.get(process, 0)
        assert process_min_bytes(ix, placement, process, 2) == mine.bytes_received
    # what is written equals what the previous planner wrote; only the senders may differ
    got = Counter((t.dst_rank, t.param, t.start, t.stop, t.local) for t in plan.transfers)
    assert got == _reference_cuts(src, dst, placement)
    # the summary (no transfer list) counts the same as the whole plan
    fast, slow = plan_summary(src, dst, placement=placement).summary(), plan.summary()
    assert fast == slow
    assert plan_summary(src, dst, placement=placement).rows == plan.stats().rows


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_senders_are_dealt_evenly(case):
    # for one cut and one destination shard, its holders' numbers of receivers differ by at
    # most one, plus the receivers that copy the cut locally instead (each took one turn)
    _, src, dst, placement = case
    plan = plan_reshard(src, dst, placement=placement)
    ix = ReshardIndex(src, dst)
    by_cut: dict[tuple, Counter] = {}
    local: Counter = Counter()
    for t in plan.transfers:
        key = (t.param, t.start, t.stop, dst.dims.rank_coords(t.dst_rank)[1:])
        if t.local:
            local[key] += 1
        else:
            by_cut.setdefault(key, Counter())[t.src_rank] += 1
    for key, senders in by_cut.items():
        seg = next(ix.segments_in(key[0], key[1], key[2]))
        holders = [ix.src_rank(j // len(seg.keys), seg.keys[j % len(seg.keys)])
                   for j in range(src.dims.dp * len(seg.keys))]
        assert set(senders) <= set(holders)
        counts = [senders.get(h, 0) for h in holders]
        assert max(counts) - min(counts) <= 1 + local[key], (key, counts)


SHAPE = ModelShape(vocab_size=61, hidden_size=8, ffn_hidden_size=16, num_layers=4, num_heads=4,
                   num_kv_heads=2, head_dim=2, qkv_bias=True)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([((1, 2, 2), (4, 1, 1), "hf", "colocated"),
                        ((2, 2, 1), (2, 2, 1), "vllm", "colocated"),
                        ((2, 1, 2), (1, 2, 1), "megatron", "split"),
                        ((2, 2, 2), (4, 2, 1), "vllm", "colocated")]),
       st.sampled_from([None, 64, 100, 1000]))
def test_each_process_schedules_its_rounds_alone(pair, bucket):
    (sd, st_, sp), (dd, dt, dp_), style, kind = pair
    src = shard_spec(SHAPE, ParallelDims(dp=sd, tp=st_, pp=sp), make_vocab_size_divisible_by=4)
    dst = shard_spec(SHAPE, ParallelDims(dp=dd, tp=dt, pp=dp_), style=style,
                     make_vocab_size_divisible_by=4)
    placement = (micro_dp_placement(src, dst) if kind == "colocated"
                 else Placement.split(src.dims.world_size, dst.dims.world_size))
    whole = schedule_plan(plan_reshard(src, dst, placement=placement), bucket_bytes=bucket)
    for process in placement.processes:
        mine = schedule_rank(plan_for_rank(src, dst, placement=placement, process=process),
                             bucket_bytes=bucket)
        want = [(r.key, tuple(m for m in r.messages if process in (m.src_process, m.dst_process)))
                for r in whole.rounds]
        assert [(r.key, r.messages) for r in mine.rounds] == [w for w in want if w[1]]
        assert mine.local == tuple(whole.local_for(process))
        assert mine.staging_bytes(process) == whole.staging_bytes(process)
        if bucket is not None:  # one peer each way per round, at most a bucket in flight
            assert mine.staging_bytes(process) <= bucket
            for r in mine.rounds:
                assert sum(m.src_process == process for m in r.messages) <= 1
                assert sum(m.dst_process == process for m in r.messages) <= 1


def test_1024_ranks_summary_agrees_with_the_ranks_own_plans():
    # TP8 x PP16 x DP8 -> TP4 x DP256 (micro-DP) on a 16-layer toy: the whole-plan summary never
    # lists a transfer; a few processes plan their own part, and it matches their summary rows.
    shape = ModelShape(vocab_size=1000, hidden_size=16, ffn_hidden_size=64, num_layers=16,
                       num_heads=8, num_kv_heads=8, head_dim=2)
    sd, dd = ParallelDims(dp=8, tp=8, pp=16), ParallelDims(dp=256, tp=4, pp=1)
    src, dst = shard_spec(shape, sd), shard_spec(shape, dd, style="vllm")
    placement = micro_dp_placement(sd, dd)
    ix = ReshardIndex(src, dst)
    stats = plan_summary(src, dst, placement=placement, index=ix)
    assert stats.bytes_sent == stats.bytes_min > 0 and stats.redundant_bytes == 0
    for process in (0, 1, 5, 127, 128, 513, 1023):
        mine = plan_for_rank(src, dst, placement=placement, process=process, index=ix)
        row = stats.rows[process]
        assert row["send_bytes"] == sum(t.nbytes for t in mine.sends)
        assert row["num_sends"] == len(mine.sends)
        assert row["recv_bytes"] == mine.bytes_received == stats.min_bytes_per_process[process]
        assert row["num_recvs"] == len(mine.receives)
        assert row["num_local"] == len(mine.local_copies)
        assert all(_touches(t, process) for t in mine.transfers)
    # balanced: the dp replicas of one training shard send within 10% of one another (shards
    # differ: the first and last stages also hold the embedding and the head)
    for tp_rank in range(sd.tp):
        for pp_rank in range(sd.pp):
            sends = [stats.rows[placement.src[sd.coords_rank(d, tp_rank, pp_rank)]]["send_bytes"]
                     for d in range(sd.dp)]
            assert max(sends) <= 1.1 * min(sends), (tp_rank, pp_rank, sends)


def test_the_planner_still_builds_reference_shards():
    # the whole plan assembled from per-rank parts passes the planner's own exactness check
    sd, dd = ParallelDims(dp=2, tp=2, pp=2), ParallelDims(dp=4, tp=2, pp=1)
    src, dst = shard_spec(SHAPE, sd, make_vocab_size_divisible_by=4), shard_spec(
        SHAPE, dd, style="vllm", make_vocab_size_divisible_by=4)
    plan = plan_reshard(src, dst, placement=micro_dp_placement(src, dst))
    _check(plan, _full(SHAPE))


def _cli(argv, capsys):
    import argparse

    from flowrl.parallel.reshard_cli import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    code = run(parser.parse_args(argv))
    out = capsys.readouterr()
    return code, out.out


def test_cli_summary_fits_one_screen_at_512_ranks(tmp_path, capsys):
    # the example layout (TP8 x PP16 x DP4 -> TP4, 512 ranks) on a 16-layer toy config:
    # the summary has the same lines whatever the model (the 7B run is in the benchmark's notes)
    import json

    config = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 16, "num_attention_heads": 8,
              "num_key_value_heads": 8}
    (tmp_path / "config.json").write_text(json.dumps(config))
    base = ["--train", "tp=8,pp=16,dp=4", "--gen", "tp=4", "--model", str(tmp_path)]
    code, out = _cli(base, capsys)
    lines = out.splitlines()
    assert code == 0 and len(lines) <= 40, out
    assert "colocated, 512 processes" in lines[0]
    assert "sent / minimum = 1.00" in out and "redundancy       0.00 MiB" in out
    assert "HybridFlow bound" in out and "most loaded:" in out
    assert next(line for line in lines if line.startswith("per rank")).split()[-3:] == [
        "min", "median", "max"]
    assert not [line for line in lines if line.strip()[:1].isdigit()]  # no per-process rows
    code, out = _cli(base + ["--json", "--bucket-mb", "0"], capsys)
    data = json.loads(out)
    assert "ranks" not in data and data["num_processes"] == 512
    spread = data["per_rank"]["recv_bytes"]
    assert spread["min"] <= spread["median"] <= spread["max"] and data["redundant_bytes"] == 0
    assert data["sampled"]["most loaded"]["rounds"] == 1  # unbounded: one round


def test_cli_per_rank_prints_every_process(tmp_path, capsys):
    import json

    config = {"model_type": "llama", "vocab_size": 100, "hidden_size": 16, "intermediate_size": 32,
              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    base = ["--train", "tp=2,pp=4,dp=4", "--gen", "tp=1", "--model", str(tmp_path)]
    _, out = _cli(base, capsys)  # 32 processes: the summary only
    assert not [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    _, out = _cli(base + ["--per-rank"], capsys)
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 32 and "schedule" in out

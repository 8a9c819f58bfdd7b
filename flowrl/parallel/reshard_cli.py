"""``flowrl reshard-plan``: what each rank sends and receives when moving training shards to a
generation layout (reshard_plan.py), and how that compares with the naive gather and the minimum.

    flowrl reshard-plan --train tp=4,pp=2,dp=1 --gen tp=2,dp=4
    flowrl reshard-plan --train tp=8,pp=16,dp=4 --gen tp=4          # 512 ranks: a summary
    flowrl reshard-plan --train tp=2,pp=2 --gen tp=1 --model /ckpt/Qwen2.5-7B --split --json
    flowrl reshard-plan --train tp=2,ep=4,pp=2 --gen tp=4,ep=2 --model qwen3-30b-a3b --gen-style hf

Mixture-of-experts models (a Qwen3-MoE / Mixtral config.json, or the presets qwen3-30b-a3b and
qwen3-235b-a22b) take expert parallelism in either layout: ``ep=N`` (expert_model_parallel_size)
and ``etp=N`` (expert_tensor_parallel_size, default tp), ranks assigned as megatron-core does.

The summary (totals, per-rank min / median / max, the HybridFlow bound, the schedule of the least,
median and most loaded processes) is computed without listing any transfer (``plan_summary``), so
it reads the same at 8 or 4,096 ranks; the table of every process (``--per-rank``, shown anyway up
to 16 processes) builds the whole plan. ``add_arguments`` fills a parser (the lead's
``flowrl/cli.py`` mounts it) and ``run`` executes parsed arguments: 0 on success, 2 with
``error: ...`` on stderr for bad inputs. Notebooks call ``reshard_plan_for(model, train=...,
gen=...)`` for the whole ``ReshardPlan``, ``reshard_summary_for`` for its ``PlanStats``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.reshard_plan import (
    Placement,
    PlanStats,
    ReshardIndex,
    ReshardPlan,
    micro_dp_placement,
    plan_for_rank,
    plan_reshard,
    plan_summary,
)
from flowrl.parallel.reshard_schedule import schedule_plan, schedule_rank
from flowrl.parallel.shard_spec import STYLES, ShardSpec, shard_spec

__all__ = ["add_arguments", "format_reshard_plan", "format_summary", "parse_layout",
           "reshard_plan_for", "reshard_summary_for", "run"]

TABLE_UP_TO = 16
"""Plans with at most this many processes print their per-process table without ``--per-rank``."""


def parse_layout(text: str, *, world_size: int | None = None, flag: str = "--train") -> ParallelDims:
    """``"tp=4,pp=2,dp=1"`` (``ep=N``, ``etp=N``, ``vpp=N`` optional) -> ParallelDims; a missing
    dp is world_size / (tp*pp), else the least that holds the experts (etp*ep / tp, at least 1)."""
    if isinstance(text, ParallelDims):
        return text
    sizes: dict[str, int | None] = {"tp": 1, "pp": 1, "dp": None, "vpp": None, "ep": 1,
                                    "etp": None}
    for item in filter(None, (s.strip() for s in str(text).split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in sizes:
            raise ValueError(f"{flag} {text!r}: write comma-separated tp=N,pp=N,dp=N (vpp=N, ep=N, "
                             "etp=N optional)")
        try:
            sizes[key] = int(value)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {key}={value!r} is not an integer") from None
    tp, pp, vpp, ep, etp = sizes["tp"], sizes["pp"], sizes["vpp"], sizes["ep"], sizes["etp"]
    try:
        if sizes["dp"] is None:
            if world_size is None:
                expert = (tp if etp is None else etp) * ep
                dp = max(1, expert // tp) if expert % tp == 0 else expert
                return ParallelDims(dp=dp, tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp)
            return ParallelDims.from_world_size(world_size, tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp)
        return ParallelDims(dp=sizes["dp"], tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp)
    except ValueError as exc:
        raise ValueError(f"{flag} {text!r}: {exc}") from None


def _setup(model: Any, train: str | ParallelDims, gen: str | ParallelDims, colocated: bool,
           gen_style: str, make_vocab_size_divisible_by: int
           ) -> tuple[ShardSpec, ShardSpec, Placement]:
    train_dims = parse_layout(train, flag="--train")
    gen_dims = parse_layout(gen, world_size=train_dims.world_size if colocated else None,
                            flag="--gen")
    src = shard_spec(model, train_dims, style="megatron",
                     make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    dst = shard_spec(src.model, gen_dims, style=gen_style,
                     make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    if colocated:
        return src, dst, micro_dp_placement(src, dst)
    return src, dst, Placement.split(train_dims.world_size, gen_dims.world_size)


def reshard_plan_for(model: Any = "7B", *, train: str | ParallelDims = "tp=1,pp=1,dp=1",
                     gen: str | ParallelDims = "tp=1", colocated: bool = True,
                     gen_style: str = "vllm", bytes_per_element: int = 2,
                     make_vocab_size_divisible_by: int = 128) -> ReshardPlan:
    """The plan from a megatron training layout to a generation layout, for notebooks.

    ``model``: a preset ("7B"), a config.json / checkpoint dir, a transformers config or a
    ``ModelShape``. Colocated plans use ``micro_dp_placement`` (the generation dp defaults to fill
    the training world); split plans put generation ranks on their own processes (dp defaults to 1).
    """
    src, dst, placement = _setup(model, train, gen, colocated, gen_style,
                                 make_vocab_size_divisible_by)
    return plan_reshard(src, dst, placement=placement, bytes_per_element=bytes_per_element)


def reshard_summary_for(model: Any = "7B", *, train: str | ParallelDims = "tp=1,pp=1,dp=1",
                        gen: str | ParallelDims = "tp=1", colocated: bool = True,
                        gen_style: str = "vllm", bytes_per_element: int = 2,
                        make_vocab_size_divisible_by: int = 128) -> PlanStats:
    """``reshard_plan_for``'s totals and per-process loads, without listing a transfer."""
    src, dst, placement = _setup(model, train, gen, colocated, gen_style,
                                 make_vocab_size_divisible_by)
    return plan_summary(src, dst, placement=placement, bytes_per_element=bytes_per_element)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``reshard-plan`` options to ``parser``."""
    parser.add_argument("--train", required=True,
                        help="training (megatron) layout, e.g. tp=4,pp=2,dp=1 or tp=2,ep=4,pp=2 "
                             "(ep/etp: expert parallel sizes; dp defaults to the least that fits)")
    parser.add_argument("--gen", required=True,
                        help="generation layout, e.g. tp=2,dp=4 or tp=4,ep=2 (colocated: dp "
                             "defaults to fill the training world)")
    parser.add_argument("--model", default="7B",
                        help="a config.json, its checkpoint directory, a preset size such as "
                             "7B or 0.5B, or a MoE preset (qwen3-30b-a3b, qwen3-235b-a22b) "
                             "(default 7B)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--colocated", dest="colocated", action="store_true", default=True,
                       help="generation ranks share the training workers (micro-DP grouping; default)")
    where.add_argument("--split", dest="colocated", action="store_false",
                       help="generation ranks on their own workers")
    parser.add_argument("--gen-style", choices=STYLES, default="vllm",
                        help="how generation shards are stored (default vllm)")
    parser.add_argument("--bytes-per-element", type=int, default=2,
                        help="bytes per parameter element (default 2, bf16)")
    parser.add_argument("--bucket-mb", type=float, default=64.0,
                        help="staging budget per process of the transport, MiB (default 64, as "
                             "rollout.reshard_bucket_mb); 0: unbounded")
    parser.add_argument("--per-rank", action="store_true",
                        help=f"also print every process's row (builds the whole plan; shown "
                             f"anyway up to {TABLE_UP_TO} processes)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**26 else f"{n / 2**20:.2f} MiB"


def _ranks(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    if not ranks:
        return "-"
    runs, start = [], ranks[0]
    for prev, cur in zip(ranks, ranks[1:] + [None]):
        if cur != prev + 1 if cur is not None else True:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(runs)


def format_table(plan: ReshardPlan) -> list[str]:
    """One line per process: its ranks, bytes sent (to which ranks) and received (from which),
    copied locally, and its peak extra memory."""
    lines = [f"{'proc':>4} {'train':>5} {'gen':>4} {'sends':>12} {'to':<12} {'receives':>12} "
             f"{'from':<12} {'local copy':>12} {'peak extra':>12}"]
    for r in plan.rank_table():
        lines.append(
            f"{r['process']:>4} {'-' if r['src_rank'] is None else r['src_rank']:>5} "
            f"{'-' if r['dst_rank'] is None else r['dst_rank']:>4} {_gib(r['send_bytes']):>12} "
            f"{_ranks(r['send_to']):<12} {_gib(r['recv_bytes']):>12} {_ranks(r['recv_from']):<12} "
            f"{_gib(r['local_bytes']):>12} {_gib(r['peak_extra_bytes']):>12}")
    return lines


def format_summary(stats: PlanStats) -> list[str]:
    """The totals and the per-rank spread, as ``flowrl reshard-plan`` prints them."""
    s = stats.summary()
    lines = [
        f"bytes sent       {_gib(s['bytes_sent'])} in {s['num_sends']} transfers "
        f"({s['num_local_copies']} local copies, {_gib(s['bytes_local'])})",
        f"minimum          {_gib(s['bytes_min'])}  (sent / minimum = {s['sent_over_min']:.2f})",
        f"naive gather     {_gib(s['bytes_naive'])}  (sent / naive = {s['sent_over_naive']:.3f})",
        (f"HybridFlow bound {_gib(s['bytes_hybridflow'])}  ((tp - t_g*p_g)/(t_g*p_g*t*p)*M per "
         "colocated rank)") if not (stats.src.dims.expert_keys or stats.dst.dims.expert_keys) else
        "HybridFlow bound n/a  (its formula has no expert parallelism)",
        f"redundancy       {_gib(s['redundant_bytes'])}",
        f"peak extra       {_gib(s['max_peak_extra_bytes'])} per process (generation shard; "
        "transports add one bucket)",
        "",
        f"{'per rank':<24}{'min':>15}{'median':>15}{'max':>15}",
    ]
    rows = [("sends", "send_bytes", "num_sends", "training"),
            ("receives", "recv_bytes", "num_recvs", "generation"),
            ("local copies", "local_bytes", "num_local", "generation")]
    for label, size, count, side in rows:
        b, n = s["per_rank"][size], s["per_rank"][count]
        lines.append(f"  {label + ' (bytes)':<22}" + "".join(
            f"{_gib(b[k]):>15}" for k in ("min", "median", "max")) + f"  ({side} ranks)")
        lines.append(f"  {label + ' (transfers)':<22}" + "".join(
            f"{n[k]:>15g}" for k in ("min", "median", "max")))
    return lines


def format_reshard_plan(plan: ReshardPlan | PlanStats, *, table: bool | None = None) -> str:
    """The header, the per-process table (``table``; default: a whole plan of at most
    ``TABLE_UP_TO`` processes) and the summary, as ``flowrl reshard-plan`` prints them."""
    stats = plan.stats() if isinstance(plan, ReshardPlan) else plan
    s = stats.summary()
    lines = [f"reshard {s['src']['layout']} ({s['src']['style']}) -> {s['dst']['layout']} "
             f"({s['dst']['style']}), {s['placement']}, {s['num_processes']} processes; model "
             f"{_gib(stats.model_bytes)} at {stats.bytes_per_element} B/element", ""]
    if table is None:
        table = isinstance(plan, ReshardPlan) and s["num_processes"] <= TABLE_UP_TO
    if table:
        lines += format_table(plan) + [""]
    return "\n".join(lines + format_summary(stats))


def _sampled_schedules(stats: PlanStats, bucket: int | None) -> dict[str, Any]:
    """Rounds and staging of the least, median and most loaded processes (sends plus receives),
    each from its own ``plan_for_rank``."""
    procs = sorted(stats.rows, key=lambda p: (stats.rows[p]["send_bytes"]
                                              + stats.rows[p]["recv_bytes"], p))
    picks = {"least loaded": procs[0], "median": procs[len(procs) // 2], "most loaded": procs[-1]}
    ix = ReshardIndex(stats.src, stats.dst)
    out = {}
    for label, proc in picks.items():
        rank_plan = plan_for_rank(stats.src, stats.dst, placement=stats.placement, process=proc,
                                  bytes_per_element=stats.bytes_per_element, index=ix)
        sched = schedule_rank(rank_plan, bucket_bytes=bucket)
        out[label] = {"process": proc, "rounds": sched.rounds_for(proc),
                      "staging_bytes": sched.staging_bytes(proc)}
    return out


def _bucket_text(bucket: int | None) -> str:
    return "unbounded" if bucket is None else f"{bucket / 2**20:g} MiB"


def run(args: argparse.Namespace) -> int:
    """Plan and print; 0 on success, 2 (with ``error: ...`` on stderr) on bad inputs."""
    kw = dict(train=args.train, gen=args.gen, colocated=args.colocated, gen_style=args.gen_style,
              bytes_per_element=args.bytes_per_element)
    bucket = int(args.bucket_mb * 2**20) or None
    try:
        stats = reshard_summary_for(args.model, **kw)
        whole = args.per_rank or len(stats.placement.processes) <= TABLE_UP_TO
        plan = reshard_plan_for(args.model, **kw) if whole else None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if plan is not None:
            schedule = schedule_plan(plan, bucket_bytes=bucket)
            sched = {"rounds": len(schedule.rounds), "max_staging_bytes": max(
                (schedule.staging_bytes(p) for p in stats.placement.processes), default=0)}
        else:
            sampled = _sampled_schedules(stats, bucket)
            sched = {"sampled": sampled, "max_staging_bytes": max(
                v["staging_bytes"] for v in sampled.values())}
    except ValueError as exc:
        print(f"error: --bucket-mb {args.bucket_mb:g}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = {**stats.summary(), "bucket_bytes": bucket, **sched}
        if plan is not None:
            out["ranks"] = plan.rank_table()
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    print(format_reshard_plan(plan if plan is not None else stats, table=plan is not None))
    if plan is not None:
        print(f"schedule         {sched['rounds']} rounds, at most "
              f"{_gib(sched['max_staging_bytes'])} staged per process at once (bucket {_bucket_text(bucket)})")
    else:
        print(f"schedule         bucket {_bucket_text(bucket)}; one peer each way per round; "
              f"at most {_gib(sched['max_staging_bytes'])} staged")
        for label, v in sched["sampled"].items():
            print(f"  {label + ':':<14} process {v['process']:>5}, {v['rounds']} rounds")
        print(f"(--per-rank: the table of all {len(stats.placement.processes)} processes)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m flowrl.parallel.reshard_cli ...`` until the subcommand is wired in."""
    parser = argparse.ArgumentParser(prog="flowrl reshard-plan", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

"""``flowrl reshard-plan``: what each rank sends and receives when moving training shards to a
generation layout (reshard_plan.py), and how that compares with the naive gather and the minimum.

    flowrl reshard-plan --train tp=4,pp=2,dp=1 --gen tp=2,dp=4
    flowrl reshard-plan --train tp=2,pp=2 --gen tp=1 --model /ckpt/Qwen2.5-7B --split --json

``add_arguments`` fills a parser (the lead's ``flowrl/cli.py`` mounts it) and ``run`` executes
parsed arguments: 0 on success, 2 with ``error: ...`` on stderr for bad inputs. Notebooks call
``reshard_plan_for(model, train=..., gen=...)`` for the same ``ReshardPlan``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.reshard_plan import Placement, ReshardPlan, micro_dp_placement, plan_reshard
from flowrl.parallel.reshard_schedule import schedule_plan
from flowrl.parallel.shard_spec import STYLES, shard_spec

__all__ = ["add_arguments", "format_reshard_plan", "parse_layout", "reshard_plan_for", "run"]


def parse_layout(text: str, *, world_size: int | None = None, flag: str = "--train") -> ParallelDims:
    """``"tp=4,pp=2,dp=1"`` -> ParallelDims; a missing dp is world_size / (tp*pp), else 1."""
    if isinstance(text, ParallelDims):
        return text
    sizes: dict[str, int | None] = {"tp": 1, "pp": 1, "dp": None, "vpp": None}
    for item in filter(None, (s.strip() for s in str(text).split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in sizes:
            raise ValueError(f"{flag} {text!r}: write comma-separated tp=N,pp=N,dp=N (vpp=N optional)")
        try:
            sizes[key] = int(value)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {key}={value!r} is not an integer") from None
    tp, pp, vpp = sizes["tp"], sizes["pp"], sizes["vpp"]
    if sizes["dp"] is None:
        if world_size is None:
            return ParallelDims(dp=1, tp=tp, pp=pp, vpp=vpp)
        return ParallelDims.from_world_size(world_size, tp=tp, pp=pp, vpp=vpp)
    return ParallelDims(dp=sizes["dp"], tp=tp, pp=pp, vpp=vpp)


def reshard_plan_for(model: Any = "7B", *, train: str | ParallelDims = "tp=1,pp=1,dp=1",
                     gen: str | ParallelDims = "tp=1", colocated: bool = True,
                     gen_style: str = "vllm", bytes_per_element: int = 2,
                     make_vocab_size_divisible_by: int = 128) -> ReshardPlan:
    """The plan from a megatron training layout to a generation layout, for notebooks.

    ``model``: a preset ("7B"), a config.json / checkpoint dir, a transformers config or a
    ``ModelShape``. Colocated plans use ``micro_dp_placement`` (the generation dp defaults to fill
    the training world); split plans put generation ranks on their own processes (dp defaults to 1).
    """
    train_dims = parse_layout(train, flag="--train")
    gen_dims = parse_layout(gen, world_size=train_dims.world_size if colocated else None,
                            flag="--gen")
    src = shard_spec(model, train_dims, style="megatron",
                     make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    dst = shard_spec(src.model, gen_dims, style=gen_style,
                     make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    if colocated:
        placement = micro_dp_placement(src, dst)
    else:
        placement = Placement.split(train_dims.world_size, gen_dims.world_size)
    return plan_reshard(src, dst, placement=placement, bytes_per_element=bytes_per_element)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``reshard-plan`` options to ``parser``."""
    parser.add_argument("--train", required=True,
                        help="training (megatron) layout, e.g. tp=4,pp=2,dp=1 (dp defaults to 1)")
    parser.add_argument("--gen", required=True,
                        help="generation layout, e.g. tp=2,dp=4 (colocated: dp defaults to fill "
                             "the training world)")
    parser.add_argument("--model", default="7B",
                        help="a config.json, its checkpoint directory, or a preset size such as "
                             "7B or 0.5B (default 7B)")
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
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**26 else f"{n / 2**20:.2f} MiB"


def _ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks)) if ranks else "-"


def format_reshard_plan(plan: ReshardPlan) -> str:
    """A per-process table and the totals, as ``flowrl reshard-plan`` prints them."""
    s = plan.summary()
    lines = [f"reshard {s['src']['layout']} ({s['src']['style']}) -> {s['dst']['layout']} "
             f"({s['dst']['style']}), {s['placement']}; model {_gib(plan.model_bytes)} at "
             f"{plan.bytes_per_element} B/element", "",
             f"{'proc':>4} {'train':>5} {'gen':>4} {'sends':>12} {'to':<12} {'receives':>12} "
             f"{'from':<12} {'local copy':>12} {'peak extra':>12}"]
    for r in plan.rank_table():
        lines.append(
            f"{r['process']:>4} {'-' if r['src_rank'] is None else r['src_rank']:>5} "
            f"{'-' if r['dst_rank'] is None else r['dst_rank']:>4} {_gib(r['send_bytes']):>12} "
            f"{_ranks(r['send_to']):<12} {_gib(r['recv_bytes']):>12} {_ranks(r['recv_from']):<12} "
            f"{_gib(r['local_bytes']):>12} {_gib(r['peak_extra_bytes']):>12}")
    naive = plan.bytes_naive
    lines += [
        "",
        f"bytes sent       {_gib(plan.bytes_sent)} in {s['num_sends']} transfers "
        f"({s['num_local_copies']} local copies, {_gib(plan.bytes_local)})",
        f"minimum          {_gib(plan.bytes_min)}  (sent / minimum = {s['sent_over_min']:.2f})",
        f"naive gather     {_gib(naive)}  (sent / naive = {s['sent_over_naive']:.3f})",
        f"HybridFlow bound {_gib(plan.bytes_hybridflow)}  ((tp - t_g*p_g)/(t_g*p_g*t*p)*M per "
        "colocated rank)",
        f"redundancy       {_gib(plan.redundant_bytes)}",
        f"peak extra       {_gib(s['max_peak_extra_bytes'])} per process (generation shard; "
        "transports add one bucket)",
    ]
    return "\n".join(lines)


def _plan_json(plan: ReshardPlan) -> dict[str, Any]:
    return {**plan.summary(), "ranks": plan.rank_table()}


def run(args: argparse.Namespace) -> int:
    """Plan and print; 0 on success, 2 (with ``error: ...`` on stderr) on bad inputs."""
    try:
        plan = reshard_plan_for(args.model, train=args.train, gen=args.gen,
                                colocated=args.colocated, gen_style=args.gen_style,
                                bytes_per_element=args.bytes_per_element)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bucket = int(args.bucket_mb * 2**20) or None
    try:
        schedule = schedule_plan(plan, bucket_bytes=bucket)
    except ValueError as exc:
        print(f"error: --bucket-mb {args.bucket_mb:g}: {exc}", file=sys.stderr)
        return 2
    procs = set(plan.placement.src) | set(plan.placement.dst)
    staging = max((schedule.staging_bytes(p) for p in procs), default=0)
    if args.json:
        json.dump({**_plan_json(plan), "bucket_bytes": bucket, "rounds": len(schedule.rounds),
                   "max_staging_bytes": staging}, sys.stdout, indent=2)
        print()
    else:
        print(format_reshard_plan(plan))
        print(f"schedule         {len(schedule.rounds)} rounds, at most {_gib(staging)} staged per "
              f"process at once (bucket {'unbounded' if bucket is None else _gib(bucket)})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m flowrl.parallel.reshard_cli ...`` until the subcommand is wired in."""
    parser = argparse.ArgumentParser(prog="flowrl reshard-plan", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

"""Reshard planning time against world size: the whole-plan summary and one rank's own plan.

    python benchmarks/reshard_planning.py [--repeats 3] [--max-world 4096] [--whole-up-to 512]
                                          [--out benchmarks/results/reshard_planning.json]

A 7B Llama shape (32 layers, bf16) is planned from the training layout TP8 x PP16 x DP(d) to two
colocated (micro-DP) generation layouts, TP4 x DP(world/4) and TP8 x DP(world/8), for world
sizes 128 ... 4,096 (d = 1 ... 32; 1,024 ranks is the issue's TP8 x PP16 x DP8). Per case,
the median over ``repeats`` of:

- ``specs_s``: both shard specs (``shard_spec``) and the placement (``micro_dp_placement``);
- ``summary_s``: the whole plan's totals and per-process loads (``plan_summary``, which lists no
  transfer; what ``flowrl reshard-plan`` prints), index included;
- ``rank_s``: what one process does in a reshard: the index of the two specs, its own transfers
  (``plan_for_rank``) and its rounds (``schedule_rank``, 64 MiB bucket), for the busiest process
  (the most transfers);
- ``whole_s`` (up to ``--whole-up-to`` ranks): every transfer listed (``plan_reshard``), the
  previous planner's only mode (27.5 s at 512 ranks before the per-rank planner).

Each case also checks the busiest process's own plan against its summary row. Pure Python on one
core: absolute times move with the machine's load (recorded in the JSON), ratios much less.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, table, write_json  # noqa: E402

from flowrl.parallel.mesh import ParallelDims  # noqa: E402
from flowrl.parallel.reshard_plan import (  # noqa: E402
    ReshardIndex,
    micro_dp_placement,
    plan_for_rank,
    plan_reshard,
    plan_summary,
)
from flowrl.parallel.reshard_schedule import schedule_rank  # noqa: E402
from flowrl.parallel.shard_spec import shard_spec  # noqa: E402

MODEL = "7B"
TRAIN = {"tp": 8, "pp": 16}
GENS = ({"tp": 4}, {"tp": 8})
BUCKET = 64 << 20


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    walls, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), out


def plan_case(model: Any, train: ParallelDims, gen: ParallelDims, *, repeats: int,
              whole: bool) -> dict[str, Any]:
    """Time one layout pair (see the module doc); the JSON-ready row."""
    def setup():
        src = shard_spec(model, train)
        dst = shard_spec(src.model, gen, style="vllm")
        return src, dst, micro_dp_placement(train, gen)

    specs_s, (src, dst, placement) = _timed(setup, repeats)
    summary_s, stats = _timed(lambda: plan_summary(src, dst, placement=placement), repeats)
    rows = stats.rows
    busiest = max(rows, key=lambda p: (rows[p]["num_sends"] + rows[p]["num_recvs"]
                                       + rows[p]["num_local"], -p))

    def one_rank():
        ix = ReshardIndex(src, dst)
        mine = plan_for_rank(src, dst, placement=placement, process=busiest, index=ix)
        return mine, schedule_rank(mine, bucket_bytes=BUCKET)

    rank_s, (mine, sched) = _timed(one_rank, repeats)
    row = rows[busiest]
    assert (len(mine.sends), len(mine.receives), len(mine.local_copies)) == (
        row["num_sends"], row["num_recvs"], row["num_local"]), "rank plan != summary row"
    out = {
        "train": str(train), "gen": str(gen), "world": train.world_size,
        "specs_s": specs_s, "summary_s": summary_s, "rank_s": rank_s,
        "whole_s": None, "num_transfers": stats.total("num_sends") + stats.total("num_local"),
        "rank_process": busiest, "rank_transfers": len(mine.transfers),
        "rank_rounds": sched.rounds_for(busiest),
        "bytes_sent": stats.bytes_sent, "bytes_min": stats.bytes_min,
        "bytes_hybridflow": stats.bytes_hybridflow,
    }
    if whole:
        out["whole_s"], _ = _timed(lambda: plan_reshard(src, dst, placement=placement), 1)
    return out


def run(*, model: Any = MODEL, max_world: int = 4096, whole_up_to: int = 512, repeats: int = 3,
        train: dict = TRAIN, gens: tuple = GENS, min_world: int = 128) -> dict[str, Any]:
    """Every (world size, generation layout) case; the JSON-ready result."""
    start = time.perf_counter()
    cases = []
    mp = train["tp"] * train["pp"]
    dp = max(1, min_world // mp)
    while mp * dp <= max_world:
        src = ParallelDims(dp=dp, **train)
        for gen in gens:
            dst = ParallelDims.from_world_size(src.world_size, **gen)
            cases.append(plan_case(model, src, dst, repeats=repeats,
                                   whole=src.world_size <= whole_up_to))
            print(f"  {src} -> {dst}: summary {cases[-1]['summary_s']:.3f} s, one rank "
                  f"{cases[-1]['rank_s']:.3f} s", flush=True)
        dp *= 2
    return {"model": str(model), "repeats": repeats, "bucket_bytes": BUCKET,
            "wall_s": time.perf_counter() - start, "machine": machine_info(), "cases": cases}


def format_table(cases: list[dict]) -> str:
    headers = ["world", "train", "gen", "specs s", "summary s", "one rank s", "whole plan s",
               "transfers", "rank transfers", "rank rounds"]
    body = [[c["world"], c["train"], c["gen"], c["specs_s"], c["summary_s"], c["rank_s"],
             "-" if c["whole_s"] is None else c["whole_s"], c["num_transfers"],
             c["rank_transfers"], c["rank_rounds"]] for c in cases]
    return table(headers, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-world", type=int, default=4096)
    parser.add_argument("--whole-up-to", type=int, default=512,
                        help="list every transfer (plan_reshard) up to this world size")
    parser.add_argument("--out", default="benchmarks/results/reshard_planning.json")
    args = parser.parse_args(argv)
    result = run(max_world=args.max_world, whole_up_to=args.whole_up_to, repeats=args.repeats)
    print(f"model {result['model']}, bf16, median of {args.repeats}; load average "
          f"{result['machine'].get('load_avg_1_5_15')}")
    print(format_table(result["cases"]))
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where one GRPO step's wall time goes: per node, and outside compute.

    python benchmarks/step_breakdown.py [--steps 12] [--warmup 2] [--out benchmarks/results/step_breakdown.json] [key=value ...]

Runs the default config (or overrides) and reads each step's metrics: ``timing_s/<node>`` is a
node's wall time inside its Dask task, ``compute_s/<x>`` the slowest rank's time inside the actor
method. The step's critical path is gen -> reward -> max(ref, old_log_prob) -> adv ->
update_actor -> reshard -> collect. Orchestration is what the step spent outside compute
(actor methods plus the plain tasks' own work): scheduling, dispatch, serialisation, transfers.
Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

NODES = ("gen", "reward", "ref", "old_log_prob", "adv", "update_actor", "reshard", "collect")
ACTOR_COMPUTE = {
    "gen": "compute_s/gen",
    "ref": "compute_s/ref_logprobs",
    "old_log_prob": "compute_s/old_logprobs",
    "update_actor": "compute_s/update_actor",
    "reshard": "compute_s/reshard",
}
TASK_COMPUTE = ("reward", "adv", "collect")  # plain tasks: their wall time is their compute


def breakdown(m: dict[str, float]) -> dict[str, float]:
    """Critical-path compute and orchestration of one step's metrics."""
    step = m["timing_s/step"]

    # ref and old_log_prob run in parallel on different groups: the slower one is on the path
    actor = sum(m.get(ACTOR_COMPUTE[n], 0.0) for n in ("gen", "update_actor", "reshard"))
    actor += max(m.get(ACTOR_COMPUTE["ref"], 0.0), m.get(ACTOR_COMPUTE["old_log_prob"], 0.0))
    task = sum(m.get(f"timing_s/{n}", 0.0) for n in TASK_COMPUTE)
    node_wall = sum(m.get(f"timing_s/{n}", 0.0) for n in ("gen", "reward", "adv", "update_actor", "reshard", "collect"))
    node_wall += max(m.get("timing_s/ref", 0.0), m.get("timing_s/old_log_prob", 0.0))
    return {
        "step_s": step,
        "actor_compute_s": actor,
        "task_compute_s": task,
        "orchestration_s": step - actor - task,
        "orchestration_share": (step - actor - task) / step,
        "outside_actor_share": (step - actor) / step,
        "between_nodes_share": (step - node_wall) / step,  # scheduling gaps between tasks alone
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the statistics")
    parser.add_argument("--out", default="benchmarks/results/step_breakdown.json")
    parser.add_argument("overrides", nargs="*", help="config overrides, key.sub=value")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")

    from flowrl import __version__
    from flowrl.config import load_config
    from flowrl.run import Run, resolve_inputs

    overrides = [f"trainer.total_training_steps={args.steps}", "trainer.save_experience=false", "trainer.progress=false"]
    overrides += [f"trainer.run_dir=/tmp/flowrl-bench/step_breakdown-{int(time.time())}"] + list(args.overrides)
    cfg = resolve_inputs(load_config(None, overrides))
    run = Run.open(cfg)
    history = []
    try:
        for _ in range(args.steps):
            history.append(run.step()[1])
    finally:
        run.close()
    measured = history[args.warmup :]

    def med(key: str) -> float:
        return statistics.median(m.get(key, 0.0) for m in measured)

    rows = []
    for name in NODES:
        key = f"timing_s/{name}"
        if not any(key in m for m in measured):
            continue
        compute_key = ACTOR_COMPUTE.get(name)
        wall, compute = med(key), (med(compute_key) if compute_key else med(key))
        rows.append({"node": name, "wall_s": wall, "compute_s": compute, "dispatch_s": wall - compute, "share_of_step": wall / med("timing_s/step")})
    parts = [breakdown(m) for m in measured]
    summary = {k: statistics.median(p[k] for p in parts) for k in parts[0]}

    print(f"{'node':<14}{'wall ms':>10}{'compute ms':>12}{'dispatch ms':>13}{'% of step':>11}")
    for r in rows:
        print(f"{r['node']:<14}{r['wall_s'] * 1e3:>10.1f}{r['compute_s'] * 1e3:>12.1f}{r['dispatch_s'] * 1e3:>13.1f}{r['share_of_step'] * 100:>10.1f}%")
    print(f"{'step':<14}{summary['step_s'] * 1e3:>10.1f}")
    print(
        f"orchestration (outside actor and task compute): {summary['orchestration_s'] * 1e3:.1f} ms = "
        f"{summary['orchestration_share'] * 100:.1f}% of the step; outside actor compute only: "
        f"{summary['outside_actor_share'] * 100:.1f}%; gaps between nodes: {summary['between_nodes_share'] * 100:.1f}%"
    )
    result = {
        "benchmark": "step_breakdown",
        "flowrl": __version__,
        "python": sys.version.split()[0],
        "machine": platform.platform(),
        "steps": args.steps,
        "warmup": args.warmup,
        "overrides": args.overrides,
        "nodes": rows,
        "median": summary,
        "per_step": [{**breakdown(m), **{k: v for k, v in m.items() if k.startswith(("timing_s/", "compute_s/"))}} for m in measured],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

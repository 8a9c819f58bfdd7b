"""The run's checks of itself (issue 32): their own time against the default task's step time,
and the default task's curve with the checks on against all off.

Two runs of the embedded default task (``flowrl train`` with no config, ``--steps`` steps, the
same seed): checks at their defaults, then every ``trainer.checks.<name>=off``. Per step of the
first run the checks' cost is

    driver: ``checks/time_s`` (every enabled check over the step's experience table), plus
    gen node: the time of ``with_response_hash`` (the per-row hash the ``tokens`` check compares)
              on the step's table, read back from ``experience/step_*.parquet`` and timed here
              (median of 5), as the node pays it on the controller worker,

against ``timing_s/step``. The target is < 3 % (median over the steps). The curve: per step
``critic/score/mean`` of both runs (same seeds; the checks read the tables and add one column).

    python benchmarks/checks_overhead.py --steps 10 --out benchmarks/results/checks_overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, package_versions, table  # noqa: E402

TARGET = 0.03


def _run(run_dir: Path, steps: int, checks_off: bool) -> list[dict]:
    from flowrl.config import load_config
    from flowrl.config.checks import ChecksConfig
    from flowrl.run import train

    off = [f"trainer.checks.{name}=off" for name in ChecksConfig().modes()] if checks_off else []
    cfg = load_config(None, [f"trainer.total_training_steps={steps}", f"trainer.run_dir={run_dir}",
                             "trainer.progress=false", "trainer.resume_mode=disable", *off])
    return train(cfg).history


def _hash_seconds(run_dir: Path, step: int, repeats: int = 5) -> float:
    import pyarrow.parquet as pq

    from flowrl.checks.tokens import with_response_hash
    from flowrl.data import experience

    tab = pq.read_table(experience.step_path(run_dir, step)).drop_columns(["response_hash"])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with_response_hash(tab)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(steps: int, root: Path) -> dict:
    on = _run(root / "on", steps, checks_off=False)
    off = _run(root / "off", steps, checks_off=True)
    rows = []
    for i, m in enumerate(on, start=1):
        driver, gen_hash = m["checks/time_s"], _hash_seconds(root / "on", i)
        rows.append({"step": i, "step_s": m["timing_s/step"], "checks_s": driver, "hash_s": gen_hash,
                     "ratio": (driver + gen_hash) / m["timing_s/step"], "num_samples": m["num_samples"],
                     "num_response_tokens": m["num_response_tokens"]})
    scores_on = [m["critic/score/mean"] for m in on]
    scores_off = [m["critic/score/mean"] for m in off]
    return {"steps": rows, "median_ratio": statistics.median(r["ratio"] for r in rows),
            "max_ratio": max(r["ratio"] for r in rows), "target": TARGET,
            "scores_checks_on": scores_on, "scores_checks_off": scores_off,
            "curve_unchanged": scores_on == scores_off}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flowrl-checks-bench-") as tmp:
        result = measure(args.steps, Path(tmp))
    result.update({"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
                   "versions": package_versions(["flowrl", "torch", "pyarrow", "numpy"])})
    print(table(["step", "step_s", "checks_s", "hash_s", "ratio"],
                [[r["step"], f"{r['step_s']:.3f}", f"{r['checks_s'] * 1e3:.2f} ms", f"{r['hash_s'] * 1e3:.2f} ms",
                  f"{r['ratio'] * 100:.2f} %"] for r in result["steps"]]))
    print(f"median {result['median_ratio'] * 100:.2f} % (max {result['max_ratio'] * 100:.2f} %, target "
          f"< {TARGET * 100:.0f} %); curve unchanged with the checks off: {result['curve_unchanged']}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["median_ratio"] < TARGET and result["curve_unchanged"] else 1


if __name__ == "__main__":
    sys.exit(main())

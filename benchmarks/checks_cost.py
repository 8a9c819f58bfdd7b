"""The cost judge of issue 32: every check of ``trainer.checks`` on together against the default
task's step time, measured in one run (target < 3 %), and the same run's curve against a run
with every check off.

One run of the embedded default task (``flowrl train`` with no config: its model, data and
settings, ``--steps`` steps) through the notebook API (``Run.step()`` runs the checks as
``flowrl train`` does); per step its checks cost

    checks_s       the driver's checks over the step's experience table (``checks/time_s``);
    hash_s         the gen node's per-row hash of the generated tokens (``tokens``), timed here
                   on the step's table (median of 5), as the node pays it;
    fingerprint_s  the weight-sync fingerprints (``weight_sync``), the slowest rank's
                   (``reshard/fingerprint_s``; 0 where the sync moves nothing: the default
                   task's hybrid engine generates with the training parameters);
    record_s       the resume record (``resume``): taken for each checkpoint and once more when a
                   run resumes, timed here after every step (``Run.resume_record``) and charged
                   in full to every step (as if every step saved a checkpoint);

against ``timing_s/step`` of the same step. A second run with ``trainer.staleness=1`` (colocated
engines: a real weight sync every step) gives the fingerprints' cost per sync. The curve: the
first run's ``critic/score/mean`` per step against a run with every ``trainer.checks.<name>=off``
(same seeds).

    python benchmarks/checks_cost.py --steps 10 --out benchmarks/results/checks_cost.json
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


def _hash_seconds(tab, repeats: int = 5) -> float:
    from flowrl.checks.tokens import with_response_hash

    tab = tab.drop_columns(["response_hash"]) if "response_hash" in tab.column_names else tab
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with_response_hash(tab)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _run(run_dir: Path, steps: int, *extra: str, record: bool = True) -> list[dict]:
    from flowrl.config import load_config
    from flowrl.run import Run, resolve_inputs

    cfg = load_config(None, [f"trainer.total_training_steps={steps}", f"trainer.run_dir={run_dir}",
                             "trainer.progress=false", "trainer.resume_mode=disable", *extra])
    run = Run.open(resolve_inputs(cfg))
    rows = []
    try:
        for _ in range(steps):
            tab, m = run.step()
            row = {"step": run.next_step, "step_s": m["timing_s/step"], "checks_s": m.get("checks/time_s", 0.0),
                   "fingerprint_s": m.get("reshard/fingerprint_s", 0.0),
                   "fingerprint_params": m.get("reshard/fingerprint_params", 0.0),
                   "score": m.get("critic/score/mean"), "health": run.health()}
            if record:
                row["hash_s"] = _hash_seconds(tab)
                start = time.perf_counter()
                run.resume_record()
                row["record_s"] = time.perf_counter() - start
                row["ratio"] = (row["checks_s"] + row["hash_s"] + row["fingerprint_s"] + row["record_s"]) / row["step_s"]
            rows.append(row)
    finally:
        run.close()
    return rows


def measure(steps: int, root: Path) -> dict:
    from flowrl.config.checks import ChecksConfig

    on = _run(root / "on", steps)
    off = _run(root / "off", steps, *[f"trainer.checks.{n}=off" for n in ChecksConfig().modes()], record=False)
    sync = _run(root / "staleness1", steps, "trainer.staleness=1", record=False)
    synced = [r for r in sync if r["fingerprint_params"]]
    return {
        "default_task": {"steps": on, "median_ratio": statistics.median(r["ratio"] for r in on),
                         "max_ratio": max(r["ratio"] for r in on), "target": TARGET,
                         "health": on[-1]["health"]},
        "curve": {"scores_checks_on": [r["score"] for r in on], "scores_checks_off": [r["score"] for r in off],
                  "unchanged": [r["score"] for r in on] == [r["score"] for r in off]},
        "staleness1_sync": {"steps": sync, "fingerprint_s_median": statistics.median(r["fingerprint_s"] for r in synced)
                            if synced else None,
                            "fingerprint_ratio_median": statistics.median(r["fingerprint_s"] / r["step_s"] for r in synced)
                            if synced else None,
                            "params_per_sync": synced[0]["fingerprint_params"] if synced else 0},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flowrl-checks-cost-") as tmp:
        result = measure(args.steps, Path(tmp))
    result.update({"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
                   "versions": package_versions(["flowrl", "torch", "pyarrow", "numpy"])})
    d = result["default_task"]
    print(table(["step", "step_s", "checks", "hash", "fingerprint", "resume record", "ratio"],
                [[r["step"], f"{r['step_s']:.3f}", f"{r['checks_s'] * 1e3:.2f} ms", f"{r['hash_s'] * 1e3:.2f} ms",
                  f"{r['fingerprint_s'] * 1e3:.2f} ms", f"{r['record_s'] * 1e3:.2f} ms", f"{r['ratio'] * 100:.2f} %"]
                 for r in d["steps"]]))
    print(f"default task: all checks {d['median_ratio'] * 100:.2f} % of the step (median; max "
          f"{d['max_ratio'] * 100:.2f} %; target < {TARGET * 100:.0f} %)")
    print(f"curve unchanged with every check off: {result['curve']['unchanged']}")
    s = result["staleness1_sync"]
    if s["fingerprint_s_median"] is not None:
        print(f"staleness 1 (a real sync per step): fingerprints {s['fingerprint_s_median'] * 1e3:.1f} ms per sync "
              f"({int(s['params_per_sync'])} parameters), {s['fingerprint_ratio_median'] * 100:.2f} % of the step")
    print(d["health"])
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if d["median_ratio"] < TARGET and result["curve"]["unchanged"] else 1


if __name__ == "__main__":
    sys.exit(main())

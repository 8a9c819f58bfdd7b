"""``flowrl verify-resume [CONFIG] [key=value ...]``: prove on a config that a run killed and
resumed equals the run that never stopped (issue 32 item 5).

Three ``flowrl train`` processes of the same config, ``trainer.total_training_steps`` = N and
``trainer.save_freq`` = K (so both runs drain and checkpoint at the same steps):

1. *uninterrupted*: steps 1 .. N;
2. *killed*: the same, killed with SIGKILL (its whole process group: driver and workers) as soon
   as the checkpoint after step K is complete;
3. *resumed*: the same command with ``trainer.resume_mode=auto`` in the killed run's directory:
   steps K+1 .. N (the resume verifies its checkpoint's record first, ``trainer.checks.resume``).

Then every metric of every step (``metrics.jsonl``; times and other wall-clock readings left
out, :func:`steady`) and every parameter and optimizer state of the final checkpoints are
compared, exactly by default (``--rtol``). The report is a table and ``verify_resume.json``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLOCK_PREFIXES = ("timing_s/", "timing_per_token_ms/", "compute_s/", "perf/")
"""Wall-clock readings: differ between any two runs."""
SYNC_PREFIXES = ("reshard/", "checks/weight_sync")
"""What a step reports of the previous step's weight sync: a resumed run's first step has none."""
HISTORY_PREFIXES = ("checks/engine_moved",)
"""A function of the syncs this process itself saw (``engine_moved`` compares each sync's probe with
the one before it): a resumed process starts with no earlier probe, and with ``trainer.staleness=1``
its first compared pair straddles the restart (measured: PPO at staleness 1, step 4 of 2 + 2: 0.0054
uninterrupted, 0.0140 resumed, every tensor equal). Not compared."""


def steady(key: str) -> bool:
    """Whether metric ``key`` is a function of the run's state (not of the wall clock): not a
    time (``timing_s/``, ``compute_s/``, ``perf/``, a ``*_s`` number), nor a reading of the async
    pipeline's timing (``async/`` idle times and queue depths; its staleness counts stay)."""
    if key.startswith(CLOCK_PREFIXES + HISTORY_PREFIXES) or key.endswith("_s") or key == "step":
        return False
    if key.startswith("async/"):
        return "staleness" in key
    return True


def _equal(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        return a == b or abs(a - b) <= rtol * max(abs(a), abs(b))
    return a == b


def compare_metrics(reference: list[dict], resumed: list[dict], *, resumed_at: int, rtol: float = 0.0) -> tuple[list[str], int]:
    """Per step, every steady metric of the uninterrupted run against the resumed run's rows:
    (differences, values compared). ``resumed_at``: the first step the resumed process ran (its
    sync-derived metrics are absent: no sync of the step before it was collected)."""
    by_step = {r["step"]: r for r in resumed}
    diffs, compared = [], 0
    for ref in reference:
        step = ref["step"]
        got = by_step.get(step)
        if got is None:
            diffs.append(f"step {step}: missing from the resumed run")
            continue
        for key in sorted(set(ref) | set(got)):
            if not steady(key):
                continue
            if key not in ref or key not in got:
                if step == resumed_at and key.startswith(SYNC_PREFIXES):
                    continue
                diffs.append(f"step {step}: {key} only in the {'uninterrupted' if key in ref else 'resumed'} run")
                continue
            compared += 1
            if not _equal(ref[key], got[key], rtol):
                diffs.append(f"step {step}: {key} = {ref[key]!r} uninterrupted, {got[key]!r} resumed")
    extra = sorted(set(by_step) - {r["step"] for r in reference})
    diffs += [f"step {s}: only in the resumed run" for s in extra]
    return diffs, compared


def compare_checkpoints(a: str, b: str, *, rtol: float = 0.0) -> tuple[list[str], int, float]:
    """Every parameter and optimizer state of two checkpoints: (differences, tensors compared,
    largest absolute difference)."""
    import numpy as np

    from flowrl.checkpoint import load_full, load_meta

    diffs, compared, worst = [], 0, 0.0
    meta_a, meta_b = load_meta(a), load_meta(b)
    tables = [(None, "parameter")] + [(s, f"optimizer {s}") for s in sorted(set(meta_a["optim"]) | set(meta_b["optim"]))]
    for state, what in tables:
        if state is not None and (state not in meta_a["optim"] or state not in meta_b["optim"]):
            diffs.append(f"{what}: in one checkpoint only")
            continue
        xs, ys = load_full(a, state=state), load_full(b, state=state)
        for name in sorted(set(xs) | set(ys)):
            if name not in xs or name not in ys:
                diffs.append(f"{what} {name}: in one checkpoint only")
                continue
            x, y = np.asarray(xs[name], dtype=np.float64), np.asarray(ys[name], dtype=np.float64)
            compared += 1
            diff = float(np.max(np.abs(x - y))) if x.size else 0.0
            worst = max(worst, diff)
            scale = float(np.max(np.abs(x))) if x.size else 0.0
            if x.shape != y.shape or diff > rtol * scale:
                diffs.append(f"{what} {name}: differs by up to {diff:.3g} (of {scale:.3g})")
    extra_a, extra_b = meta_a.get("extra", {}), meta_b.get("extra", {})
    for key in ("next_step", "optim_step", "algorithm_state", "stream"):
        if extra_a.get(key) != extra_b.get(key):
            diffs.append(f"checkpoint meta {key}: {extra_a.get(key)!r} uninterrupted, {extra_b.get(key)!r} resumed")
    return diffs, compared, worst


# ----------------------------------------------------------------------------- the runs
@dataclass
class Phase:
    name: str
    wall_s: float = 0.0
    returncode: int | None = None
    log: str = ""


@dataclass
class Report:
    steps: int
    kill_after: int
    phases: list[Phase] = field(default_factory=list)
    metric_diffs: list[str] = field(default_factory=list)
    metrics_compared: int = 0
    state_diffs: list[str] = field(default_factory=list)
    tensors_compared: int = 0
    max_abs_diff: float = 0.0
    error: str = ""

    @property
    def passed(self) -> bool:
        return not self.error and not self.metric_diffs and not self.state_diffs

    def table(self) -> str:
        lines = [f"{'phase':<15}{'wall s':>9}  exit"]
        lines += [f"{p.name:<15}{p.wall_s:>9.1f}  {p.returncode}" for p in self.phases]
        lines.append(f"metrics: {self.metrics_compared} values over {self.steps} steps compared, "
                     f"{len(self.metric_diffs)} differ")
        lines.append(f"state:   {self.tensors_compared} parameter and optimizer tensors compared, "
                     f"{len(self.state_diffs)} differ (largest difference {self.max_abs_diff:.3g})")
        for d in (self.metric_diffs + self.state_diffs)[:20]:
            lines.append(f"  {d}")
        if self.error:
            lines.append(f"error: {self.error}")
        verdict = "PASS" if self.passed else "FAIL"
        lines.append(f"verify-resume {verdict}: killed after step {self.kill_after} of {self.steps} and resumed "
                     + ("equals the uninterrupted run" if self.passed else "differs from the uninterrupted run"))
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"passed": self.passed, "steps": self.steps, "kill_after": self.kill_after,
                "phases": [vars(p) | {"log": p.log[-2000:]} for p in self.phases],
                "metrics_compared": self.metrics_compared, "metric_diffs": self.metric_diffs,
                "tensors_compared": self.tensors_compared, "state_diffs": self.state_diffs,
                "max_abs_diff": self.max_abs_diff, "error": self.error}


def _command(items: list[str], run_dir: Path, steps: int, kill_after: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "flowrl.cli", "train", *items, f"trainer.run_dir={run_dir}",
            f"trainer.total_training_steps={steps}", f"trainer.save_freq={kill_after}", "trainer.progress=false",
            *extra]


def _group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def _run(name: str, cmd: list[str], timeout_s: float, log_dir: Path) -> Phase:
    start = time.perf_counter()
    log = log_dir / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            code = None
        finally:
            _kill_group(proc.pid, proc)
    return Phase(name, time.perf_counter() - start, code, log.read_text())


def _kill_group(pgid: int, proc: subprocess.Popen) -> None:
    """SIGKILL what is left of the process group (never leave a worker behind); reap the driver
    first (a zombie keeps its group alive)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)
    _group_gone(pgid, 60)


def _run_and_kill(cmd: list[str], run_dir: Path, kill_after: int, timeout_s: float, log_dir: Path) -> Phase:
    """Start ``cmd``; SIGKILL its process group once the checkpoint after step ``kill_after`` is
    complete. ``returncode`` is the process's (``-9`` when killed)."""
    from flowrl.checkpoint import latest_checkpoint, load_meta
    from flowrl.run.checkpointing import checkpoint_root

    start = time.perf_counter()
    log = log_dir / "killed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        killed = False
        try:
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                found = latest_checkpoint(checkpoint_root(run_dir))
                if found is not None and int(load_meta(found)["step"]) >= kill_after:
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.05)
        finally:
            _kill_group(proc.pid, proc)
        code = proc.wait(timeout=60)
    return Phase("killed", time.perf_counter() - start, code if killed or code != -signal.SIGKILL else None,
                 log.read_text())


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def verify_resume(items: list[str], out_dir: Path, *, steps: int, kill_after: int, rtol: float = 0.0,
                  timeout_s: float = 3600.0) -> Report:
    """Run the three processes of ``items`` (``flowrl train``'s arguments) under ``out_dir`` and
    compare (the module's docstring)."""
    from flowrl.checkpoint import latest_checkpoint
    from flowrl.run.checkpointing import checkpoint_root

    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(steps=steps, kill_after=kill_after)
    ref_dir, cut_dir = out_dir / "uninterrupted", out_dir / "interrupted"
    fresh = "trainer.resume_mode=disable"
    phase = _run("uninterrupted", _command(items, ref_dir, steps, kill_after, fresh), timeout_s, out_dir)
    report.phases.append(phase)
    if phase.returncode != 0:
        report.error = f"the uninterrupted run failed (exit {phase.returncode}): {phase.log[-1500:]}"
        return report
    phase = _run_and_kill(_command(items, cut_dir, steps, kill_after, fresh), cut_dir, kill_after, timeout_s, out_dir)
    report.phases.append(phase)
    if phase.returncode != -signal.SIGKILL:
        report.error = (f"the run to kill ended by itself (exit {phase.returncode}) before its checkpoint after step "
                        f"{kill_after} was seen; give it more steps (--steps) or check its log: {phase.log[-1500:]}")
        return report
    resumed_at = kill_after + 1
    phase = _run("resumed", _command(items, cut_dir, steps, kill_after, "trainer.resume_mode=auto"), timeout_s, out_dir)
    report.phases.append(phase)
    if phase.returncode != 0:
        report.error = f"the resumed run failed (exit {phase.returncode}): {phase.log[-1500:]}"
        return report
    if f"resumed from step {kill_after}" not in phase.log:
        report.error = f"the resumed run did not resume from the checkpoint after step {kill_after}: {phase.log[-1500:]}"
        return report
    report.metric_diffs, report.metrics_compared = compare_metrics(_rows(ref_dir), _rows(cut_dir), resumed_at=resumed_at,
                                                                   rtol=rtol)
    a, b = latest_checkpoint(checkpoint_root(ref_dir)), latest_checkpoint(checkpoint_root(cut_dir))
    if a is None or b is None:
        report.error = f"no final checkpoint to compare ({a}, {b})"
        return report
    report.state_diffs, report.tensors_compared, report.max_abs_diff = compare_checkpoints(a, b, rtol=rtol)
    for root in sorted(ref_dir.glob("*_checkpoints")):  # the family's other trainable groups (the PPO critic)
        a, b = latest_checkpoint(root), latest_checkpoint(cut_dir / root.name)
        if a is None or b is None:
            report.state_diffs.append(f"{root.name}: no final checkpoint in both runs ({a}, {b})")
            continue
        diffs, n, worst = compare_checkpoints(a, b, rtol=rtol)
        report.state_diffs += [f"{root.name}: {d}" for d in diffs]
        report.tensors_compared += n
        report.max_abs_diff = max(report.max_abs_diff, worst)
    return report

"""SLURM through its commands: is it up, which jobs a run holds, cancelling them.

:func:`check_reachable` runs before the first ``sbatch``: the commands are installed, the
controller answers ``sinfo`` within seconds and the partition exists and is up, else a
:class:`~flowrl.config.errors.ConfigError` naming the problem (``flowrl submit`` prints it as an
``error:`` line); :func:`check_submission` has ``sbatch --test-only`` vet the job script (account,
partition, limits) before any job is queued. :func:`job_failure` is polled while the workers start: a job that SLURM failed,
or that left the queue without a worker joining, ends the wait at once with its state and the
tail of its log instead of the whole ``cluster.startup_timeout_s``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0
"""How long ``sinfo``/``squeue`` may take to answer before SLURM counts as down."""
FAILED_STATES = ("BOOT_FAIL", "CANCELLED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT")
HOPELESS_REASONS = ("PartitionDown", "PartitionInactive", "InvalidAccount", "InvalidQOS", "PartitionNodeLimit",
                    "PartitionTimeLimit", "ReqNodeNotAvail", "BadConstraints", "AccountNotAllowed")


def _run(cmd: list[str], timeout: float = PROBE_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def check_reachable(queue: str) -> None:
    """Raise a ConfigError unless SLURM can take jobs now (in partition ``queue`` if given)."""
    from flowrl.config.errors import ConfigError

    missing = [c for c in ("sbatch", "squeue", "scancel", "sinfo") if shutil.which(c) is None]
    if missing:
        raise ConfigError("cluster.kind", "slurm", f"needs the SLURM commands {missing}, not found on PATH",
                          "run flowrl submit on a SLURM login node (or load its module), or use flowrl train")
    try:
        out = _run(["sinfo", "-h", "-o", "%P|%a"])
    except subprocess.TimeoutExpired:
        raise ConfigError("cluster.kind", "slurm", f"SLURM does not answer: sinfo took over {PROBE_TIMEOUT_S:.0f}s",
                          "check the controller (scontrol ping) and try again") from None
    if out.returncode != 0:
        detail = (out.stderr or out.stdout).strip().splitlines()
        raise ConfigError("cluster.kind", "slurm", f"SLURM is not usable: sinfo failed ({' '.join(detail[-2:])})",
                          "check the controller (scontrol ping; SLURM_CONF), or ask your admins")
    parts = {}
    for line in out.stdout.splitlines():
        name, _, avail = line.partition("|")
        parts[name.strip()] = avail.strip()
    if not parts:
        raise ConfigError("cluster.kind", "slurm", "SLURM lists no partition (sinfo)", "ask your admins")
    if queue:
        found = parts.get(queue, parts.get(queue + "*"))
        if found is None:
            raise ConfigError("cluster.slurm.queue", queue, "is not a SLURM partition",
                              "use one of " + ", ".join(p.rstrip("*") for p in parts))
        if found != "up":
            raise ConfigError("cluster.slurm.queue", queue, f"is {found}, not up (sinfo)", "use another partition")


def check_submission(job_script: str, directory: str | Path) -> None:
    """``sbatch --test-only`` of the run's job script (written 0600 under ``directory``, then
    removed): an account, partition or limit SLURM rejects is a ConfigError with SLURM's words,
    before any job is submitted."""
    from flowrl.config.errors import ConfigError

    path = Path(directory) / "flowrl-test-only.sh"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(job_script)
    try:
        out = _run(["sbatch", "--test-only", str(path)])
    except subprocess.TimeoutExpired:
        raise ConfigError("cluster.kind", "slurm", f"SLURM does not answer: sbatch took over {PROBE_TIMEOUT_S:.0f}s",
                          "check the controller (scontrol ping) and try again") from None
    finally:
        path.unlink(missing_ok=True)
    if out.returncode != 0:
        detail = " ".join((out.stderr or out.stdout).strip().splitlines()[-2:])
        raise ConfigError("cluster.slurm", "(job settings)", f"SLURM rejects the job: {detail}",
                          "fix cluster.slurm.queue / account / memory / walltime / job_extra_directives")


def job_failure(job_name: str, ever_listed: bool, log_dir: str | Path | None) -> str | None:
    """Why the jobs named ``job_name`` will never bring their workers, or None while they may:
    a failed state, a reason that never clears, or (after they were listed) gone from the queue."""
    try:
        out = _run(["squeue", "-h", "-n", job_name, "-o", "%i|%T|%R"])
    except subprocess.TimeoutExpired:
        return None  # a slow controller is not a failed job
    if out.returncode != 0:
        return f"squeue failed: {(out.stderr or out.stdout).strip()}"
    rows = [line.split("|") for line in out.stdout.splitlines() if line.count("|") == 2]
    for job_id, state, reason in rows:
        if state in FAILED_STATES or any(r in reason for r in HOPELESS_REASONS):
            return f"SLURM job {job_id} is {state} ({reason}){_log_tail(log_dir, job_id)}"
    if ever_listed and not rows:
        return f"the run's SLURM jobs left the queue before their workers joined{_log_tail(log_dir, '')}"
    return None


def _log_tail(log_dir: str | Path | None, job_id: str, lines: int = 8) -> str:
    if not log_dir or not Path(log_dir).is_dir():
        return ""
    logs = sorted(Path(log_dir).glob(f"*{job_id}*.err"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return ""
    tail = logs[-1].read_text(errors="replace").splitlines()[-lines:]
    return f"; end of {logs[-1]}:\n" + "\n".join(tail)


def list_jobs(job_name: str) -> list[str]:
    """Ids of jobs named ``job_name`` that ``squeue`` still lists (any state)."""
    if not shutil.which("squeue"):
        return []
    try:
        out = _run(["squeue", "-h", "-n", job_name, "-o", "%i"], timeout=30)
    except subprocess.TimeoutExpired:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def cancel_jobs(job_name: str, *, wait_s: float = 30.0) -> list[str]:
    """``scancel`` every job named ``job_name``; wait up to ``wait_s`` until squeue drops them.
    Returns the ids still listed at the end (empty when all are gone)."""
    if not shutil.which("scancel"):
        return []
    import getpass

    try:
        _run(["scancel", "-n", job_name, "-u", getpass.getuser()], timeout=max(5.0, wait_s))
    except subprocess.TimeoutExpired:
        log.warning("scancel -n %s did not answer", job_name)
        return list_jobs(job_name)
    deadline = time.monotonic() + wait_s
    left = list_jobs(job_name)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = list_jobs(job_name)
    if left and wait_s > 0:
        log.warning("SLURM jobs %s (%s) still listed %.0fs after scancel", left, job_name, wait_s)
    return left


def wait_for_workers(handle: Any, n: int, timeout: float, log_dir: str | Path | None) -> None:
    """``client.wait_for_workers(n)`` in short slices, failing as soon as :func:`job_failure`
    finds a reason (or the jobs never reached the queue: sbatch failed)."""
    deadline = time.monotonic() + timeout
    start, ever_listed = time.monotonic(), False
    while True:
        try:
            handle.client.wait_for_workers(n, timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            return
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise
        ever_listed = ever_listed or bool(list_jobs(handle.job_name))
        why = job_failure(handle.job_name, ever_listed, log_dir)
        if why is None and not ever_listed and time.monotonic() - start > 15.0:
            why = "no job of the run reached the queue within 15s (sbatch failed? see the log above)"
        if why is not None:
            from flowrl.config.errors import ConfigError

            raise ConfigError("cluster.kind", "slurm", f"the workers cannot start: {why}",
                              "fix the job settings (cluster.slurm.*) or the SLURM problem named, then run again")

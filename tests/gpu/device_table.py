"""The table of ``tests/gpu/device_check.sh``, and its check that every rank used the GPU.

    python tests/gpu/device_table.py table CHECK_DIR [CHECK_DIR ...]   # print the table; exit 1 on a problem
    python tests/gpu/device_table.py watch OUT_FILE PID                 # record GPU processes while PID lives
    python tests/gpu/device_table.py wait-free SECONDS                  # until no process holds the GPU

A CHECK_DIR is what device_check.sh leaves for one ``flowrl train`` run:

- ``check.json``: ``{"label", "placement", "rc", "seconds"}`` (``rc`` of ``timeout flowrl train``);
- ``plan.txt``: the output of ``flowrl devices`` with the run's keys (one row per rank);
- ``run/metrics.jsonl``: the run's per-step metrics;
- ``gpu_procs.txt`` (from ``watch``): one line per sample and process holding the GPU,
  ``<source> <pid> <MiB>``, source ``smi`` (nvidia-smi's compute apps) or ``fd`` (a process with
  ``/dev/nvidia<N>`` open, for containers whose nvidia-smi lists no processes).

Every rank used the GPU when: the plan gives every rank a GPU; the run reports GPU memory
(``perf/max_memory_allocated_gb``, ``perf/rollout_max_memory_allocated_gb``: the actor's and the
rollout's rank 0 on GPU, absent on CPU); and at least as many processes held the GPU during the
run as the plan has rank processes (one per rank and group, one per rank under the hybrid
placement). Pure-Python, no torch: the unit test runs it on fake files on CPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Metric names, as flowrl/catalog/metric_names.py spells them (read here without importing flowrl).
THROUGHPUT = "perf/throughput"
MFU = "perf/mfu/actor"
GPU_MEMORY = ("perf/max_memory_allocated_gb", "perf/rollout_max_memory_allocated_gb")
WEIGHT_SYNC = "timing_s/reshard"
SCORE = "critic/score/mean"

COLUMNS = ("strategy", "steps", "tokens/s", "MFU", "peak GPU GB", "weight sync s", "score first/last",
           "GPU procs", "status")


# --------------------------------------------------------------------------- reading


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The steps of a ``metrics.jsonl``, in order; a line cut short by a kill is skipped."""
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def parse_plan(text: str) -> list[dict[str, str]]:
    """The rank rows of ``flowrl devices``' table: a header, a line of dashes whose runs mark the
    columns, one row per rank, then the inventory line."""
    lines = text.splitlines()
    for i in range(len(lines) - 1):
        if lines[i].split()[:2] == ["group", "rank"] and lines[i + 1].startswith("---"):
            starts = [m.start() for m in re.finditer(r"-+", lines[i + 1])]

            def cells(line: str) -> list[str]:
                return [line[a:b].strip() for a, b in zip(starts, [*starts[1:], len(line) + 1])]

            names = cells(lines[i])
            rows = []
            for line in lines[i + 2:]:
                if not line.strip() or line.startswith("inventory"):
                    break
                rows.append(dict(zip(names, cells(line))))
            return rows
    return []


def expected_processes(plan: list[dict[str, str]], placement: str) -> int:
    """Rank processes of the run: one per row, but under the hybrid placement one process per
    actor rank holds that rank of the rollout, the actor and the reference (the plan shows them
    as the fused group ``actor_rollout_ref``, or as three groups)."""
    groups = {r.get("group") for r in plan}
    if "actor_rollout_ref" in groups:
        return sum(1 for r in plan if r.get("group") == "actor_rollout_ref")
    if placement == "hybrid":
        return sum(1 for r in plan if r.get("group") == "actor")
    return len(plan)


def gpu_pids(text: str) -> dict[str, set[int]]:
    """Per source (``smi``, ``fd``), the processes seen holding the GPU (``smi``: with memory > 0)."""
    out: dict[str, set[int]] = {"smi": set(), "fd": set()}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[0] not in out:
            continue
        try:
            pid, mib = int(parts[1]), float(parts[2])
        except ValueError:
            continue
        if parts[0] == "fd" or mib > 0:
            out[parts[0]].add(pid)
    return out


# --------------------------------------------------------------------------- summary


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps; tokens/s and MFU averaged over the steps after the first (the first pays for
    warm-up) when there are more; peak GPU memory over all steps; mean weight-sync time of the
    steps that synced; the first and the last step's mean score."""
    timed = rows[1:] if len(rows) > 1 else rows

    def values(name: str, of: list[dict[str, Any]]) -> list[float]:
        return [float(r[name]) for r in of if isinstance(r.get(name), (int, float))]

    memory = [v for name in GPU_MEMORY for v in values(name, rows)]
    scores = values(SCORE, rows)
    return {
        "steps": len(rows),
        "tokens_per_s": _mean(values(THROUGHPUT, timed)),
        "mfu": _mean(values(MFU, timed)),
        "peak_gpu_gb": max(memory) if memory else None,
        "weight_sync_s": _mean(values(WEIGHT_SYNC, rows)),
        "score_first": scores[0] if scores else None,
        "score_last": scores[-1] if scores else None,
    }


def problems(check: dict[str, Any], summary: dict[str, Any], plan: list[dict[str, str]],
             pids: dict[str, set[int]] | None) -> list[str]:
    """Why this run does not show every rank on the GPU (empty: it does). ``pids`` is None when
    no process record exists (then the metrics alone are the evidence)."""
    out = []
    rc = check.get("rc")
    if rc == "skipped":
        out.append("not run: the 8-minute budget was spent")
    elif rc != 0:
        out.append(f"flowrl train exited {rc}" + (" (timed out)" if rc in (124, 137) else ""))
    if not plan:
        out.append("flowrl devices printed no plan")
    for r in plan:
        if r.get("GPUs", "-") in ("", "-") or "cuda" not in r.get("backend", ""):
            out.append(f"the plan puts {r.get('group')} rank {r.get('rank')} on the CPU "
                       f"(GPUs {r.get('GPUs')!r}, backend {r.get('backend')!r})")
    if summary["steps"] == 0:
        out.append("no step in metrics.jsonl")
    elif not summary["peak_gpu_gb"]:
        out.append("no step reports GPU memory (" + ", ".join(GPU_MEMORY) + "): the ranks ran on the CPU")
    if pids is not None and plan:
        want, seen = expected_processes(plan, check.get("placement", "")), max(len(pids["smi"]), len(pids["fd"]))
        if seen < want:
            out.append(f"{seen} process(es) held the GPU during the run, the plan has {want} rank process(es)")
    return out


def procs_cell(plan: list[dict[str, str]], placement: str, pids: dict[str, set[int]] | None) -> str:
    if pids is None:
        return "n/a"
    return f"{max(len(pids['smi']), len(pids['fd']))}/{expected_processes(plan, placement)}"


# --------------------------------------------------------------------------- the table


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_row(check: dict[str, Any], summary: dict[str, Any], plan: list[dict[str, str]],
              pids: dict[str, set[int]] | None, issues: list[str]) -> list[str]:
    score = ("-" if summary["score_first"] is None
             else f"{summary['score_first']:.3f} -> {summary['score_last']:.3f}")
    return [str(check.get("label", "?")), str(summary["steps"]), _fmt(summary["tokens_per_s"], ".0f"),
            _fmt(summary["mfu"], ".3f"), _fmt(summary["peak_gpu_gb"], ".2f"), _fmt(summary["weight_sync_s"], ".3f"),
            score, procs_cell(plan, check.get("placement", ""), pids), "ok" if not issues else "FAIL"]


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def load(check_dir: Path) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, str]], dict[str, set[int]] | None]:
    check_file = check_dir / "check.json"
    check = json.loads(check_file.read_text()) if check_file.is_file() else {"label": check_dir.name, "rc": None}
    plan_file = check_dir / "plan.txt"
    plan = parse_plan(plan_file.read_text()) if plan_file.is_file() else []
    procs_file = check_dir / "gpu_procs.txt"
    pids = gpu_pids(procs_file.read_text()) if procs_file.is_file() else None
    return check, summarize(read_metrics(check_dir / "run" / "metrics.jsonl")), plan, pids


def table(check_dirs: list[Path]) -> tuple[str, list[str]]:
    """The table, and every problem as ``<label>: <problem>``."""
    rows, issues = [], []
    for d in check_dirs:
        check, summary, plan, pids = load(d)
        found = problems(check, summary, plan, pids)
        rows.append(table_row(check, summary, plan, pids, found))
        issues += [f"{check.get('label', d.name)}: {p}" for p in found]
    return format_table(rows), issues


# --------------------------------------------------------------------------- watching


def _fd_holders() -> set[int]:
    """Processes of this machine with a GPU device file (``/dev/nvidia<N>``) open."""
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                if re.fullmatch(r"/dev/nvidia\d+", os.readlink(fd.path)):
                    found.add(int(entry.name))
                    break
        except OSError:
            continue
    return found


def watch(out: Path, pid: int, interval_s: float = 2.0) -> None:
    """Append ``smi <pid> <MiB>`` / ``fd <pid> 0`` lines to ``out`` every ``interval_s`` while ``pid`` lives."""
    with out.open("a") as f:
        while True:
            try:
                os.kill(pid, 0)
            except OSError:
                return
            try:
                smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
                for line in smi.stdout.splitlines():
                    parts = [p.strip() for p in line.split(",")]
                    if len(parts) == 2 and parts[0].isdigit():
                        f.write(f"smi {parts[0]} {parts[1] if parts[1].replace('.', '').isdigit() else 0}\n")
            except (OSError, subprocess.SubprocessError):
                pass
            for holder in sorted(_fd_holders() - {os.getpid()}):
                f.write(f"fd {holder} 0\n")
            f.flush()
            time.sleep(interval_s)


def wait_free(timeout_s: float) -> int:
    """Wait until no process holds a GPU device file (the last run's workers gone), at most
    ``timeout_s``; the holders left, if any, are printed."""
    deadline = time.monotonic() + timeout_s
    while (holders := _fd_holders() - {os.getpid()}) and time.monotonic() < deadline:
        time.sleep(1.0)
    if holders:
        print(f"warning: processes {sorted(holders)} still hold the GPU after {timeout_s:.0f} s")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "table":
        text, issues = table([Path(a) for a in argv[1:]])
        print(text)
        for issue in issues:
            print(f"FAIL {issue}")
        if not issues:
            print("every rank of every run used the GPU (plan, reported GPU memory, processes holding the GPU)")
        return 1 if issues else 0
    if len(argv) == 2 and argv[0] == "wait-free":
        return wait_free(float(argv[1]))
    if len(argv) == 3 and argv[0] == "watch":
        watch(Path(argv[1]), int(argv[2]))
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

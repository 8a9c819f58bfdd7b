"""tests/gpu/device_table.py on fake run folders: the table device_check.sh prints, and its
verdict that every rank used the GPU (issue 28). CPU only, no flowrl run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "gpu" / "device_table.py"
_spec = importlib.util.spec_from_file_location("device_table", _PATH)
device_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_table)

# `flowrl devices cluster.placement=colocated actor.data_parallel_size=1 rollout.data_parallel_size=1
# ref.data_parallel_size=1 --gpus-per-node 1`, as printed.
GPU_PLAN = """\
group    rank  node  GPUs  local rank  backend             dtype
-------  ----  ----  ----  ----------  ------------------  --------
actor    0     0     0     0           cpu:gloo,cuda:nccl  bfloat16
rollout  0     0     0     0           cpu:gloo,cuda:nccl  bfloat16
ref      0     0     0     0           cpu:gloo,cuda:nccl  bfloat16
inventory: 1 node(s) x 1 GPU(s) = 1 (--gpus-per-node/--nodes); GPUs used: 1
"""
# `flowrl devices --gpus-per-node 0`: the hybrid placement's fused group, on the CPU.
CPU_PLAN = """\
group              rank  node  GPUs  local rank  backend  dtype
-----------------  ----  ----  ----  ----------  -------  -------
actor_rollout_ref  0     0     -     0           gloo     float32
actor_rollout_ref  1     0     -     1           gloo     float32
inventory: 1 node(s), no GPU (--gpus-per-node/--nodes); every rank on the CPU
"""


def _step(step: int, **metrics: float) -> dict:
    return {"step": step, **metrics}


GPU_STEPS = [
    _step(0, **{"perf/throughput": 1000.0, "perf/mfu/actor": 0.10, "perf/max_memory_allocated_gb": 9.5,
                "perf/rollout_max_memory_allocated_gb": 4.0, "critic/score/mean": 0.25}),
    _step(1, **{"perf/throughput": 3000.0, "perf/mfu/actor": 0.30, "perf/max_memory_allocated_gb": 11.0,
                "perf/rollout_max_memory_allocated_gb": 12.25, "timing_s/reshard": 0.5, "critic/score/mean": 0.0}),
    _step(2, **{"perf/throughput": 5000.0, "perf/mfu/actor": 0.40, "perf/max_memory_allocated_gb": 11.0,
                "perf/rollout_max_memory_allocated_gb": 12.0, "timing_s/reshard": 0.25, "critic/score/mean": 0.125}),
]


def _check_dir(root: Path, name: str, *, rc=0, placement="colocated", plan=GPU_PLAN, steps=GPU_STEPS,
               procs: str | None = "smi 11 900\nsmi 12 800\nsmi 13 700\n", tail: str = "") -> Path:
    d = root / name
    (d / "run").mkdir(parents=True)
    (d / "check.json").write_text(json.dumps({"label": name, "placement": placement, "rc": rc, "seconds": 60}))
    (d / "plan.txt").write_text(plan)
    (d / "run" / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps) + tail)
    if procs is not None:
        (d / "gpu_procs.txt").write_text(procs)
    return d


def test_plan_rows_and_rank_processes():
    rows = device_table.parse_plan(GPU_PLAN)
    assert [r["group"] for r in rows] == ["actor", "rollout", "ref"]
    assert rows[0] == {"group": "actor", "rank": "0", "node": "0", "GPUs": "0", "local rank": "0",
                       "backend": "cpu:gloo,cuda:nccl", "dtype": "bfloat16"}
    assert device_table.expected_processes(rows, "colocated") == 3  # a process per rank and group
    assert device_table.expected_processes(rows, "hybrid") == 1  # one process holds all three
    fused = device_table.parse_plan(CPU_PLAN)
    assert [r["GPUs"] for r in fused] == ["-", "-"]
    assert device_table.expected_processes(fused, "hybrid") == 2
    assert device_table.parse_plan("error: actor.data_parallel_size=2: ...") == []


def test_summary_by_hand():
    s = device_table.summarize(GPU_STEPS)
    assert s["steps"] == 3
    assert s["tokens_per_s"] == pytest.approx(4000.0)  # steps 1 and 2: (3000 + 5000) / 2, warm-up left out
    assert s["mfu"] == pytest.approx(0.35)  # (0.30 + 0.40) / 2
    assert s["peak_gpu_gb"] == 12.25  # the largest of both memory metrics over all steps
    assert s["weight_sync_s"] == pytest.approx(0.375)  # (0.5 + 0.25) / 2: the steps that synced
    assert (s["score_first"], s["score_last"]) == (0.25, 0.125)


def test_gpu_run_passes_and_prints_its_row(tmp_path, capsys):
    d = _check_dir(tmp_path, "dp", tail='{"step": 3, "perf/thr')  # a line cut short by the kill
    assert device_table.main(["table", str(d)]) == 0
    out = capsys.readouterr().out
    header, dashes, row = out.splitlines()[:3]
    assert header.split("  ")[0] == "strategy" and "weight sync s" in header and "MFU" in header
    assert row.split() == ["dp", "3", "4000", "0.350", "12.25", "0.375", "0.250", "->", "0.125", "3/3", "ok"]
    assert "every rank of every run used the GPU" in out


def test_absent_mfu_and_sync_print_a_dash(tmp_path, capsys):
    steps = [{k: v for k, v in s.items() if k not in ("perf/mfu/actor", "timing_s/reshard")} for s in GPU_STEPS]
    d = _check_dir(tmp_path, "dp_hybrid", placement="hybrid", steps=steps, procs="fd 40 0\nfd 40 0\n")
    assert device_table.main(["table", str(d)]) == 0
    row = capsys.readouterr().out.splitlines()[2].split()
    assert row[3:6] == ["-", "12.25", "-"] and row[-2:] == ["1/1", "ok"]  # fd record: 1 process of 1


def test_cpu_run_fails_naming_why(tmp_path, capsys):
    steps = [{k: v for k, v in s.items() if "memory" not in k} for s in GPU_STEPS]
    d = _check_dir(tmp_path, "cpu", placement="hybrid", plan=CPU_PLAN, steps=steps, procs="")
    assert device_table.main(["table", str(d)]) == 1
    out = capsys.readouterr().out
    assert "FAIL cpu: the plan puts actor_rollout_ref rank 0 on the CPU" in out
    assert "FAIL cpu: no step reports GPU memory" in out
    assert "FAIL cpu: 0 process(es) held the GPU during the run, the plan has 2 rank process(es)" in out


def test_too_few_gpu_processes_timeout_and_skip(tmp_path, capsys):
    few = _check_dir(tmp_path, "fsdp", rc=124, procs="smi 11 900\nsmi 12 0\n")  # pid 12 held no memory
    skipped = _check_dir(tmp_path, "megatron_tp1", rc="skipped", steps=[], procs=None)
    assert device_table.main(["table", str(few), str(skipped)]) == 1
    out = capsys.readouterr().out
    assert "FAIL fsdp: flowrl train exited 124 (timed out)" in out
    assert "FAIL fsdp: 1 process(es) held the GPU during the run, the plan has 3 rank process(es)" in out
    assert "FAIL megatron_tp1: not run: the 8-minute budget was spent" in out
    assert "FAIL megatron_tp1: no step in metrics.jsonl" in out
    skipped_row = out.splitlines()[3].split()
    assert skipped_row[:2] == ["megatron_tp1", "0"] and skipped_row[-2:] == ["n/a", "FAIL"]  # no process record


def test_gpu_pids_reads_both_sources():
    pids = device_table.gpu_pids("smi 1 10\nsmi 2 0\nfd 3 0\nfd 3 0\ngarbage\nsmi x 5\n")
    assert pids == {"smi": {1}, "fd": {3}}

"""The hybrid engine with vLLM on a GPU (issue 29 item 5): `flowrl train` with
``cluster.placement=hybrid rollout.name=vllm`` (vLLM inside the trainer's process, external
launcher), bf16, on a ~0.5B Qwen2-shaped model built from a config (``build_model.py``; random
weights: this measures the hand-over, not learning), for a few GRPO steps; then the same with LoRA
adapters (bf16, adapters only, each process installing them in its own engine); with two or more
GPUs also an engine of tp 2 over two trainer ranks.

    PYTHONPATH=. python tests/gpu/hybrid_vllm_gpu.py [--steps 3] [--timeout 240]   (a machine with vLLM)
    PYTHONPATH=. python tests/gpu/hybrid_vllm_gpu.py --cpu     (the vLLM CPU build: the tiny vllm-preset
                                                                task, to check this script's own path)

Each run is one ``flowrl train`` process under its own timeout, below the whole script's. One
table: run, steps, seconds per step, weight-sync seconds and bytes, the peak memory of each phase
(``perf/hybrid_{rollout,actor,sync}_peak_mem_bytes``: GPU memory on a GPU, the process's RSS on
CPU), the rank's largest phase over its trainer's state plus the KV cache
(``perf/hybrid_peak_over_state_and_kv``), the engine-vs-trainer log-prob agreement
(``rollout/logprob_diff_max`` and ``_p99``) and the rollout correction's KL. Checks, each a non-zero exit: every run finishes its steps; the hybrid sync of
the full model moves no bytes between processes at tp 1 (by reference);
the LoRA sync moves only adapters, in the process (nothing between processes; what it holds well
under the full model's bytes); the engine's log-probs
agree with the trainer's (bf16 on GPU: max |diff| < 0.5 and |KL| < 1e-2; fp32 on CPU: 1e-4);
every phase reports its peak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PHASES = ("rollout", "actor", "sync")
COLUMNS = ("run", "steps", "s/step", "sync s", "sync MB", *(f"{p} GB" for p in PHASES), "peak/(state+kv)",
           "logp diff max", "logp diff p99", "rollout KL", "status")


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch / no driver: no GPU
        return 0


def _task(root: Path, cpu: bool) -> tuple[Path, Path]:
    """(model dir, train parquet): the 0.5B model on GPU, the vllm-preset default task on CPU."""
    if cpu:
        from flowrl.tasks.default_task import prepare_default_task

        cache = Path(os.environ.get("FLOWRL_CACHE_DIR", Path.home() / ".cache" / "flowrl"))
        task = prepare_default_task(cache / "default_task_vllm", preset="vllm")
        return task.model_dir, task.train_path
    sys.path.insert(0, str(HERE))
    from build_model import build

    build(root)
    return root / "model", root / "data" / "train.parquet"


def _runs(model: Path, data: Path, steps: int, cpu: bool, gpus: int) -> dict[str, list[str]]:
    common = [
        f"model.path={model}", f"data.train_files={data}", "rollout.name=vllm", "cluster.placement=hybrid",
        f"trainer.total_training_steps={steps}", "data.train_batch_size=16", "rollout.n=4",
        # two optimizer steps per batch: the old-log-prob pass runs, which measures the engine's
        # log-probs against the trainer's (rollout/logprob_diff_max)
        "actor.ppo_mini_batch_size=8", "actor.use_kl_loss=false", "rollout.free_cache_engine=true",
        "trainer.progress=false", "rollout.response_length=16", "data.max_prompt_length=32",
    ]
    common += ["rollout.enforce_eager=true"] if cpu else ["rollout.gpu_memory_utilization=0.4"]
    runs = {
        "hybrid tp1": [*common, "actor.data_parallel_size=1", "rollout.data_parallel_size=1"],
        # LoRA: each process installs the trainer's adapters in its own engine (adapters only)
        "hybrid tp1 LoRA": [*common, "actor.data_parallel_size=1", "rollout.data_parallel_size=1",
                            "model.lora_rank=8", "model.lora_alpha=16", "actor.optim.lr=1e-4"],
    }
    if cpu or gpus >= 2:
        runs["hybrid tp2"] = [*common, "actor.data_parallel_size=2", "rollout.data_parallel_size=1",
                              "rollout.tensor_model_parallel_size=2"]
    return runs


def _model_bytes(model: Path) -> float:
    """The checkpoint's bytes on disk (its weights)."""
    return float(sum(p.stat().st_size for p in model.glob("*.safetensors")))


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _summary(name: str, rows: list[dict], rc: int, seconds: float, steps: int, cpu: bool,
             full_bytes: float) -> tuple[list[str], list[str]]:
    """A table row and the problems of one run."""
    problems = []
    if rc != 0:
        problems.append(f"exit {rc}" + (" (timeout)" if rc in (124, -9) else ""))
    if len(rows) != steps:
        problems.append(f"{len(rows)} of {steps} steps")
    synced = [r for r in rows if "timing_s/reshard" in r]
    peaks = {p: max((r.get(f"perf/hybrid_{p}_peak_mem_bytes", 0.0) for r in synced), default=0.0) for p in PHASES}
    if synced and "hybrid" in name and not all(peaks.values()):
        problems.append("a phase reported no peak: " + ", ".join(p for p, v in peaks.items() if not v))
    sync_bytes = max((r.get("reshard/bytes", 0.0) for r in synced), default=0.0)
    if synced and name == "hybrid tp1" and sync_bytes:
        problems.append(f"the tp1 hybrid sync moved {sync_bytes:.0f} bytes (by reference: 0)")
    staged = max((r.get("reshard/peak_extra_bytes", 0.0) for r in synced), default=0.0)
    if synced and "LoRA" in name and (sync_bytes or not 0 < staged < full_bytes / 4):
        problems.append(f"the LoRA sync moved {sync_bytes:.0f} bytes between processes (in process: 0) and "
                        f"held {staged:.0f} (adapters only: > 0, < 1/4 of the model's {full_bytes:.0f})")
    diffs = [r["rollout/logprob_diff_max"] for r in rows if "rollout/logprob_diff_max" in r]
    diff = max(diffs) if diffs else float("nan")
    p99 = max((r["rollout/logprob_diff_p99"] for r in rows if "rollout/logprob_diff_p99" in r), default=float("nan"))
    # the hybrid rank's largest phase over its trainer's state plus the KV cache (HybridRole.budget_metrics)
    ratio = max((r["perf/hybrid_peak_over_state_and_kv"] for r in synced if "perf/hybrid_peak_over_state_and_kv" in r),
                default=float("nan"))
    kl = max((abs(r.get("rollout_corr/kl", 0.0)) for r in rows), default=0.0)
    bound = 1e-4 if cpu else 0.5
    if not diff <= bound:
        problems.append(f"engine vs trainer log-prob diff {diff:.3g} > {bound:g}")
    if not cpu and kl > 1e-2:
        problems.append(f"rollout KL {kl:.3g} > 1e-2")
    per_step = seconds / max(len(rows), 1)
    sync_s = sum(r.get("timing_s/reshard", 0.0) for r in synced) / max(len(synced), 1)
    row = [name, str(len(rows)), f"{per_step:.1f}", f"{sync_s:.3f}", f"{sync_bytes / 1e6:.1f}",
           *(f"{peaks[p] / 1e9:.2f}" for p in PHASES), f"{ratio:.2f}", f"{diff:.2e}", f"{p99:.2e}", f"{kl:.1e}",
           "ok" if not problems else "FAIL"]
    return row, problems


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[c]) for r in [list(COLUMNS), *rows]) for c in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in [list(COLUMNS), *rows]]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=240, help="seconds per run (default 240)")
    parser.add_argument("--cpu", action="store_true", help="the vLLM CPU build and the tiny vllm-preset task")
    parser.add_argument("--only", default="", help="run only the runs whose name contains this")
    args = parser.parse_args()
    gpus = _gpus()
    if not args.cpu and not gpus:
        print("no CUDA device (use --cpu for the vLLM CPU build)")
        return 2
    root = Path(tempfile.mkdtemp(prefix="flowrl-hybrid-vllm-"))
    model, data = _task(root / "task", args.cpu)
    table, failed = [], []
    for name, keys in _runs(model, data, args.steps, args.cpu, gpus).items():
        if args.only and args.only not in name:
            continue
        run_dir = root / name.replace(" ", "_")
        cmd = [sys.executable, "-m", "flowrl.cli", "train", *keys, f"trainer.run_dir={run_dir}"]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            rc, tail = proc.returncode, (proc.stdout[-1500:] + proc.stderr[-2500:])
        except subprocess.TimeoutExpired as exc:
            rc, tail = 124, str(exc.stdout or "")[-1500:]
        row, problems = _summary(name, _rows(run_dir), rc, time.perf_counter() - start, args.steps, args.cpu,
                                 full_bytes=_model_bytes(model))
        table.append(row)
        print(f"[{name}] {'ok' if not problems else '; '.join(problems)}", flush=True)
        if problems:
            failed.append(name)
            print(tail, flush=True)
    print()
    print(_table(table))
    print(f"\n{'all hybrid vLLM checks passed' if not failed else 'FAILED: ' + ', '.join(failed)} "
          f"({'CPU build' if args.cpu else f'{gpus} GPU(s)'}; run dirs under {root})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""End-to-end throughput of GRPO steps, split into phases, with each phase's MFU.

    python benchmarks/throughput.py [--cells default:16x8x8,10m:8x8x64] [--steps 3] [--warmup 1]
                                    [--out benchmarks/results/throughput.json] [key=value ...]

A cell is ``<model>:<prompts>x<samples per prompt>x<response tokens>``; the model is a preset of
``flowrl.models.tiny`` (``default`` 0.13M, ``vllm`` 0.4M, ``10m``) or ``0.5b`` (Qwen2-0.5B's layer
shape, 33 layers, the task's 99-token vocabulary: 0.49B parameters, as ``tests/gpu/build_model.py``),
built with random weights whose EOS is never sampled, so every response has its full length. Each
cell runs ``flowrl train`` **at its defaults** (no flags but the cell's sizes and ``key=value``
overrides) on the addition task for ``warmup + steps`` steps; the first ``warmup`` are left out.

Per measured step, from the step's own metrics and the driver's clock:

- **wall**: the driver's time from one step's end to the next's (what a user waits per step);
- **phases** on the step's critical path, each by its node's own clock: generation; log-probs, the
  slower of the reference's and the old policy's, which run side by side; the update; reward,
  advantages and collection; and **overhead**, the rest of the wall: scheduling, dispatch,
  transfers, the driver's bookkeeping (metrics, experience Parquet) and the part of the weight
  sync that it does not hide. So phases + overhead = wall; the check is that the phases alone do
  not exceed the wall by more than 5% (no phase counted twice);
- **sync**: the weight sync's own time (it runs after the update, while the driver records the
  step, so only part of it is on the wall);
- **tokens/s per device**: prompt + response tokens of the step over its wall time and the ranks'
  devices (GPUs in the device plan; on the CPU each rank process, which runs one thread);
- **MFU** of generation, log-probs and the update: FLOPs counted as verl counts them
  (``flowrl.metrics.mfu``: 2 per weight and token forward, 6 with the backward, plus causal
  attention) over the phase's seconds and the devices' peak: on a GPU its dense bf16 peak, on the
  CPU a one-thread fp32 matmul rate measured here (``--cpu-peak-n``);
- padding ratios and peak memory as the run reports them.

Prints a table and writes JSON (medians over the measured steps, and every step). Runs unchanged
on a GPU machine (the device plan then puts each rank on its GPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

#: Qwen2-0.5B's layer shape, less its vocabulary (tests/gpu/build_model.py says why 33 layers)
MODEL_05B = dict(arch="qwen2", hidden_size=896, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                 num_layers=33, tie_word_embeddings=True)
DEFAULT_CELLS = "default:16x8x8,10m:8x8x64"
AGREEMENT = 0.05  # how far the phases alone may exceed the wall (clock skew between processes)


def parse_cell(text: str) -> dict[str, Any]:
    """``10m:8x8x64`` -> model, prompts, samples, tokens; a clear error naming the cell otherwise."""
    from flowrl.models.tiny import TINY_PRESETS

    try:
        model, sizes = text.split(":")
        prompts, samples, tokens = (int(x) for x in sizes.split("x"))
    except ValueError:
        raise SystemExit(f"--cells: {text!r} is not <model>:<prompts>x<samples>x<tokens> (e.g. 10m:8x8x64)") from None
    if model not in TINY_PRESETS and model != "0.5b":
        raise SystemExit(f"--cells: model {model!r} unknown; use one of {', '.join([*TINY_PRESETS, '0.5b'])}")
    if min(prompts, samples, tokens) < 1:
        raise SystemExit(f"--cells: {text!r}: sizes must be >= 1")
    return {"cell": text, "model": model, "prompts": prompts, "samples": samples, "tokens": tokens}


def build_model(model: str, out: Path, max_positions: int) -> tuple[Path, int]:
    """A random model of preset ``model`` whose EOS is never sampled; its directory and size."""
    import torch

    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, count_parameters, tiny_preset

    tok = build_char_tokenizer()
    kwargs = dict(MODEL_05B) if model == "0.5b" else tiny_preset(model)
    net = build_tiny_model(tok, max_position_embeddings=max_positions, seed=0, **kwargs)
    with torch.no_grad():  # feature 0 up for every token, down for EOS: full-length responses
        weight = net.get_input_embeddings().weight
        weight[:, 0] += 2.0
        weight[tok.eos_token_id, 0] = -2.0
    net.save_pretrained(out)
    tok.save_pretrained(out)
    return out, count_parameters(net)


def cpu_peak_flops(n: int, repeats: int = 5) -> float:
    """One thread's fp32 matmul rate (FLOP/s), the best of ``repeats`` (a rank runs one thread)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 2.0 * n ** 3 / best


def phases(m: dict[str, float], wall: float) -> dict[str, float]:
    """The critical-path phases of one step's metrics (seconds) and the overhead: the rest of
    the step's ``wall``."""
    out = {
        "generation": m.get("timing_s/gen", 0.0),
        "log_probs": max(m.get("timing_s/ref", 0.0), m.get("timing_s/old_log_prob", 0.0)),
        "update": m.get("timing_s/update_actor", 0.0),
        "reward_adv": sum(m.get(f"timing_s/{n}", 0.0) for n in ("reward", "adv", "collect")),
    }
    out["overhead"] = wall - sum(out.values())
    return out


def phase_flops(flops: Any, seqlens: list[int], m: dict[str, float], epochs: int) -> dict[str, float]:
    """FLOPs of generation (a forward over prompt and response), the log-prob passes the step
    ran (reference, old policy: a forward each) and the update (forward and backward, per epoch)."""
    forward = flops.train_flops(seqlens) / 3.0
    passes = ("timing_s/ref" in m) + ("timing_s/old_log_prob" in m)
    return {"generation": forward, "log_probs": passes * forward, "update": epochs * flops.train_flops(seqlens)}


def run_cell(cell: dict[str, Any], *, steps: int, warmup: int, overrides: list[str], peak: float | None,
             workdir: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from transformers import AutoConfig

    from flowrl.config import load_config
    from flowrl.metrics.mfu import ModelFlops
    from flowrl.run import train
    from flowrl.run.topology import plan_devices_for
    from flowrl.tasks.arithmetic import write_addition_parquet
    from flowrl.graphs.family import resolve_family

    name = cell["cell"].replace(":", "_")
    model_dir, params = build_model(cell["model"], workdir / f"model_{name}", cell["tokens"] + 32)
    train_path, _ = write_addition_parquet(workdir / "data", 1024, 0, 0)
    run_dir = workdir / f"run_{name}"
    cfg = load_config(None, [
        f"model.path={model_dir}", f"data.train_files={train_path}", f"trainer.run_dir={run_dir}",
        f"data.train_batch_size={cell['prompts']}", f"rollout.n={cell['samples']}",
        f"rollout.response_length={cell['tokens']}", f"actor.ppo_mini_batch_size={cell['prompts']}",
        f"trainer.total_training_steps={warmup + steps}", "trainer.progress=false",
        "trainer.checks.reward_signal=off",  # a random model whose EOS is never sampled scores 0: no signal, by design
        *overrides])
    plan = plan_devices_for(cfg, resolve_family(cfg)(cfg).group_specs())
    gpus = {(r.node, g) for r in plan.ranks for g in getattr(r, "gpus", ()) or ()}
    devices = len(gpus) or len({(r.group, r.rank) for r in plan.ranks if r.group != "controller"})
    ends: list[float] = []
    rows: list[dict[str, float]] = []

    def on_step(step: int, metrics: dict[str, float]) -> None:
        ends.append(time.perf_counter())
        rows.append(dict(metrics))

    ends.append(time.perf_counter())
    train(cfg, on_step=on_step)
    flops = ModelFlops.from_hf_config(AutoConfig.from_pretrained(model_dir))
    files = sorted((run_dir / "experience").glob("step_*.parquet"))
    measured = []
    for i in range(warmup, len(rows)):
        m, wall = rows[i], ends[i + 1] - ends[i]
        if i == 0:
            continue  # the first step's wall includes the start of the workers
        tab = pq.read_table(files[i], columns=["prompt_ids", "response_ids"])
        seqlens = [len(p) + len(r) for p, r in zip(tab.column("prompt_ids").to_pylist(),
                                                  tab.column("response_ids").to_pylist())]
        ph = phases(m, wall)
        fl = phase_flops(flops, seqlens, m, cfg.actor.ppo_epochs)
        step = {
            "wall_s": wall, "step_s": m["timing_s/step"], **{f"{k}_s": v for k, v in ph.items()},
            "weight_sync_s": m.get("timing_s/reshard", 0.0),
            "tokens": sum(seqlens), "tokens_per_s_per_device": sum(seqlens) / wall / devices,
            "phases_over_wall": (wall - ph["overhead"]) / wall,
            "gen_padding_ratio": m.get("perf/gen_padding_ratio"), "train_padding_ratio": m.get("perf/train_padding_ratio"),
            "peak_memory_gb": m.get("perf/max_memory_allocated_gb", m.get("perf/max_rss_gb")),
        }
        if peak:
            for k in ("generation", "log_probs", "update"):
                step[f"mfu_{k}"] = fl[k] / max(ph[k], 1e-9) / (peak * devices)
        measured.append(step)
    if not measured:
        raise SystemExit(f"cell {cell['cell']}: no measured step (raise --steps)")
    med = {k: statistics.median(s[k] for s in measured) for k in measured[0] if measured[0][k] is not None}
    return {**cell, "parameters": params, "devices": devices, "median": med, "steps": measured}


COLUMNS = [("tok/s/dev", "tokens_per_s_per_device", "{:.0f}"), ("wall s", "wall_s", "{:.3f}"),
           ("gen s", "generation_s", "{:.3f}"), ("logp s", "log_probs_s", "{:.3f}"), ("upd s", "update_s", "{:.3f}"),
           ("rew+adv s", "reward_adv_s", "{:.3f}"), ("overhead s", "overhead_s", "{:.3f}"),
           ("phases/wall", "phases_over_wall", "{:.2f}"), ("sync s", "weight_sync_s", "{:.3f}"),
           ("MFU gen", "mfu_generation", "{:.1%}"), ("MFU logp", "mfu_log_probs", "{:.1%}"),
           ("MFU upd", "mfu_update", "{:.1%}"), ("pad gen", "gen_padding_ratio", "{:.2f}"),
           ("pad train", "train_padding_ratio", "{:.2f}"), ("peak GB", "peak_memory_gb", "{:.2f}")]


def render(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        med = r["median"]
        rows.append([r["cell"], f"{r['parameters'] / 1e6:.2f}M", r["devices"],
                     *(fmt.format(med[key]) if med.get(key) is not None else "-" for _, key, fmt in COLUMNS)])
    return common.table(["cell", "params", "devices", *(h for h, _, _ in COLUMNS)], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", default=DEFAULT_CELLS, help=f"comma-separated cells (default {DEFAULT_CELLS})")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per cell")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out (at least 1: worker start)")
    parser.add_argument("--cpu-peak-n", type=int, default=512, help="matrix size of the CPU peak measurement")
    parser.add_argument("--out", default="benchmarks/results/throughput.json")
    parser.add_argument("overrides", nargs="*", help="config overrides, key.sub=value (the defaults otherwise)")
    args = parser.parse_args(argv)
    cells = [parse_cell(c) for c in args.cells.split(",") if c]
    from flowrl.cluster.inventory import machine_inventory
    from flowrl.metrics.mfu import peak_bf16_flops

    inventory = machine_inventory()
    if inventory.has_gpus:
        import torch

        device, peak = torch.cuda.get_device_name(0), peak_bf16_flops(torch.cuda.get_device_name(0))
        peak_source = "dense bf16 peak of the data sheet"
    else:
        device, peak = "cpu", cpu_peak_flops(args.cpu_peak_n)
        peak_source = f"one thread's fp32 matmul, n={args.cpu_peak_n}, measured here"
    results = []
    with tempfile.TemporaryDirectory(prefix="flowrl-throughput-") as tmp:
        for cell in cells:
            results.append(run_cell(cell, steps=args.steps, warmup=max(1, args.warmup), overrides=args.overrides,
                                    peak=peak, workdir=Path(tmp)))
            print(f"{cell['cell']}: done", flush=True)
    print(f"\ndevice {device}; peak {peak / 1e9:.1f} GFLOP/s per device ({peak_source})" if peak else f"\ndevice {device}")
    print(render(results))
    bad = [r["cell"] for r in results if r["median"]["phases_over_wall"] > 1 + AGREEMENT]
    if bad:
        print(f"the phases exceed the wall by more than {AGREEMENT:.0%} (counted twice?) in: {', '.join(bad)}")
    common.write_json({"machine": common.machine_info(), "device": device, "peak_flops_per_device": peak,
                              "peak_source": peak_source, "overrides": args.overrides, "steps": args.steps,
                              "warmup": args.warmup, "cells": results}, args.out)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

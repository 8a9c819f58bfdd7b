"""DPO on the warm model's own pairs: held-out greedy accuracy before and after.

    python benchmarks/dpo_accuracy.py [--steps 100] [--save-every 25] [--seeds 0 1]
                                      [--out benchmarks/results/dpo_accuracy.json]

The default task's warm model (``~/.cache/flowrl/default_task/model``, built once as ``flowrl
train`` builds it) answers 8 samples to each of 4,096 train prompts; a prompt it answers both
right and wrong gives pairs, the right answer chosen against up to 4 distinct wrong ones
(``flowrl.tasks.arithmetic.make_model_pair_rows``). Then, for each seed, the command a user runs::

    flowrl train algorithm.family=dpo model.path=$WARM data.train_files=pairs.parquet \\
        data.val_files=val_pairs.parquet algorithm.dpo.beta=1.0 actor.optim.lr=3e-5 \\
        data.train_batch_size=64 actor.ppo_mini_batch_size=64 trainer.total_training_steps=100 ...

with a checkpoint every ``--save-every`` steps, each exported (``flowrl export-hf``) and decoded
greedily on all 792 prompts of the test split (never seen by the warm-up or the pairs), and
sampled (4 answers at temperature 1.0).

The pairs are sampled at temperature 0.5 (``--pair-temperature``): the warm-up's label smoothing
(0.4) spreads the model's mass so that at temperature 1.0 its wrong answers are mostly garbage
(``116`` against ``m]``); pushing those down raises the sampled accuracy but not the greedy one.
At 0.5 the wrong answers are near misses (``153`` against ``154``, a carry), the mistakes greedy
decoding makes. ``--contrast`` adds one run on temperature-1.0 pairs (the reward model's pairs
in the README's chain) to show the difference. beta 1.0 and lr 3e-5: at beta 0.1 / lr 1e-4 the
greedy accuracy falls (0.92 -> 0.64 with near misses, 0.82 with garbage) while the pair
accuracy rises (exploration on the task's 512 test prompts); at beta 1.0 / lr 3e-5 the greedy
accuracy plateaus from about 50 to 125 steps and falls slowly past it (0.975 at 100, 0.959 at 150),
so 100 steps is the default; the table lists every saved step.

Measured (2 cores, shared; ``benchmarks/results/dpo_accuracy.json``): 1,974 pairs at T=0.5;
greedy 0.933 -> 0.971 in 100 steps for both seeds (sampled 0.145 -> 0.20), 21-29 s of steps,
32-43 s per command; T=1.0 pairs (10,884): 0.933 -> 0.943 (sampled 0.26).
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, package_versions, table, write_json  # noqa: E402

NUM_TRAIN_PROMPTS = 4096
NUM_VAL_PROMPTS = 512


def held_out_accuracy(model_dir: str | Path) -> dict[str, float]:
    """Greedy and sampled (4 at temperature 1.0) exact match on every prompt of the test split."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flowrl.tasks.arithmetic import make_addition_rows, split_pairs
    from flowrl.tasks.warmup import evaluate_accuracy, torch_threads

    rows = make_addition_rows(len(split_pairs("test")), 0, "test")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    with torch_threads(1):
        return {"greedy": evaluate_accuracy(model, tokenizer, rows, num_samples=1, temperature=0.0),
                "sampled": evaluate_accuracy(model, tokenizer, rows, num_samples=4, temperature=1.0, seed=0),
                "num_prompts": len(rows)}


def make_pairs(warm: Path, work: Path, temperature: float) -> dict[str, Any]:
    """Train pairs (train split) and held-out pairs (test split) from the warm model's samples."""
    from flowrl.tasks.arithmetic import make_model_pair_rows, write_rows

    start = time.perf_counter()
    train = make_model_pair_rows(warm, NUM_TRAIN_PROMPTS, 0, "train", temperature=temperature)
    val = make_model_pair_rows(warm, NUM_VAL_PROMPTS, 0, "test", temperature=temperature)
    tag = f"t{temperature:g}"
    return {"temperature": temperature, "num_train_pairs": len(train), "num_val_pairs": len(val),
            "train_files": str(write_rows(work / f"pairs_{tag}.parquet", train)),
            "val_files": str(write_rows(work / f"val_pairs_{tag}.parquet", val)),
            "examples": train[:4], "seconds": round(time.perf_counter() - start, 1)}


def dpo_command(warm: Path, pairs: dict, run_dir: Path, *, steps: int, save_every: int, seed: int, beta: float,
                lr: float) -> list[str]:
    """``flowrl train algorithm.family=dpo ...`` as a user types it (one rank per group)."""
    return ["flowrl", "train", "algorithm.family=dpo", f"model.path={warm}", f"data.train_files={pairs['train_files']}",
            f"data.val_files={pairs['val_files']}", f"algorithm.dpo.beta={beta}", f"actor.optim.lr={lr}",
            "data.train_batch_size=64", "actor.ppo_mini_batch_size=64", f"trainer.total_training_steps={steps}",
            "actor.data_parallel_size=1", "ref.data_parallel_size=1", f"trainer.seed={seed}",
            f"trainer.test_freq={steps}", f"trainer.save_freq={save_every}", "trainer.max_ckpt_to_keep=0",
            f"trainer.run_dir={run_dir}", "trainer.progress=false"]


def run_dpo(warm: Path, pairs: dict, run_dir: Path, **kw: Any) -> dict[str, Any]:
    """One DPO run; the held-out accuracy of every saved checkpoint and the run's last metrics."""
    from flowrl.checkpoint.hf_export import export_hf

    command = dpo_command(warm, pairs, run_dir, **kw)
    argv = [sys.executable, "-c", "import sys; from flowrl.cli import main; sys.exit(main())", *command[1:]]
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    done = [line for line in proc.stdout.splitlines() if line.startswith("done:")]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    by_step = []
    for ckpt in sorted((run_dir / "checkpoints").glob("step_*")):
        step = int(ckpt.name.split("_")[1])
        out = export_hf(ckpt, run_dir / f"hf_{ckpt.name}", warm)
        by_step.append({"step": step, **held_out_accuracy(out)})
    keep = ("actor/dpo_loss", "actor/rewards/margins", "actor/rewards/accuracies", "val-core/dpo/rewards/accuracies",
            "val-core/dpo/rewards/margins", "val-core/dpo/dpo_loss")
    return {"command": " ".join(command), "seed": kw["seed"], "wall_s": round(wall, 1),
            "train_s": _done_seconds(done), "by_step": by_step,
            "last_metrics": {k: round(last[k], 4) for k in keep if k in last}}


def _done_seconds(done: list[str]) -> float | None:
    """The seconds of the run's ``done: N steps in S s`` line (the steps, without start-up)."""
    try:
        return float(done[-1].split(" in ")[1].split("s")[0])
    except (IndexError, ValueError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--pair-temperature", type=float, default=0.5)
    parser.add_argument("--contrast", action=argparse.BooleanOptionalAction, default=True,
                        help="also one run (first seed) on pairs sampled at temperature 1.0")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "dpo_accuracy.json"))
    args = parser.parse_args()

    from flowrl.run.preflight import default_cache_dir
    from flowrl.tasks.default_task import prepare_default_task

    start = time.perf_counter()
    task = prepare_default_task(default_cache_dir() / "default_task")
    warm = task.model_dir
    before = held_out_accuracy(warm)
    runs = []
    with tempfile.TemporaryDirectory(prefix="dpo_accuracy_") as tmp:
        work = Path(tmp)
        temperatures = [args.pair_temperature] + ([1.0] if args.contrast and args.pair_temperature != 1.0 else [])
        pairs = {t: make_pairs(warm, work, t) for t in temperatures}
        cases = [(args.pair_temperature, seed) for seed in args.seeds] + [(t, args.seeds[0]) for t in temperatures[1:]]
        for temperature, seed in cases:
            run = run_dpo(warm, pairs[temperature], work / f"run_t{temperature:g}_s{seed}", steps=args.steps,
                          save_every=args.save_every, seed=seed, beta=args.beta, lr=args.lr)
            runs.append({"pair_temperature": temperature, **run})
            print(f"pairs at T={temperature:g}, seed {seed}: {run['wall_s']} s, last greedy "
                  f"{run['by_step'][-1]['greedy']:.3f}", flush=True)
    rows = [["warm model", "-", "-", 0, f"{before['greedy']:.3f}", f"{before['sampled']:.3f}", "-"]]
    for run in runs:
        for point in run["by_step"]:
            rows.append([f"dpo T={run['pair_temperature']:g}", run["seed"],
                         pairs[run["pair_temperature"]]["num_train_pairs"], point["step"], f"{point['greedy']:.3f}",
                         f"{point['sampled']:.3f}", run["wall_s"] if point is run["by_step"][-1] else ""])
    print(table(["model", "seed", "pairs", "step", "greedy", "sampled (T=1)", "run wall s"], rows))
    result = {
        "benchmark": "dpo_accuracy", "warm_model": str(warm), "warm_model_steps": task.warmup_steps,
        "held_out": f"all {before['num_prompts']} prompts of the test split", "before": before,
        "pairs": {str(t): {k: v for k, v in p.items() if k not in ("train_files", "val_files")}
                  for t, p in pairs.items()},
        "settings": {"steps": args.steps, "beta": args.beta, "lr": args.lr, "batch_pairs": 64,
                     "torch_threads_eval": 1},
        "runs": runs, "total_s": round(time.perf_counter() - start, 1),
        "machine": machine_info(), "versions": package_versions(["torch", "transformers", "dask", "distributed"]),
    }
    write_json(result, args.out)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    main()

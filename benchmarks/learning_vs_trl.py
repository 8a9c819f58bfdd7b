"""Does flowrl learn as much per step as TRL's ``GRPOTrainer``? Held-out accuracy after N GRPO steps.

Both frameworks start from the same warmed-up model directory (a 0.65M-parameter Qwen2 with the
character tokenizer, trained briefly on two-digit addition until greedy decoding solves about 40%
of the probe prompts), train on the same prompts in the same order (``data.shuffle=false`` /
``shuffle_dataset=False`` on a per-seed permutation written to the Parquet file) with the same
settings, and their final weights are scored by ONE evaluator (:func:`evaluate_policy`, plain
transformers ``generate``, neither framework's code): greedy exact-match accuracy on 256 held-out
prompts (pairs of the test split, never trained on), plus the entropy of the sampled answers and
the KL divergence from the start policy (per response token, k1 estimate on answers sampled from
the final policy). Each run also records its own per-step sampled reward and entropy.

    python benchmarks/learning_vs_trl.py --variants aligned --seeds 0 1 2 --steps 300
    python benchmarks/learning_vs_trl.py --variants aligned linear --frameworks flowrl trl --jobs 2

Each (variant, framework, seed) is a child process (1 torch thread; flowrl with one rollout and one
actor worker) whose result is cached as ``<workdir>/<variant>/<framework>_s<seed>.json``, so an
interrupted sweep resumes. ``--jobs`` children run at once. The table prints mean and sample std
over seeds; the JSON goes to ``--out``.

Settings every variant shares (TRL's defaults that differ from flowrl's are set explicitly on the
TRL side, listed in ``ALIGNED``): 16 prompts x 8 samples, 8 new tokens, temperature 1.0 with no
top-k/top-p, AdamW lr 1e-4, eps 1e-8, weight decay 0, grad-norm clip 1.0, KL beta 0 (no reference
model), PPO clip 0.2, one optimizer step per batch (no old-log-prob pass), token-mean loss over the
batch's completion tokens (TRL ``loss_type="dapo"`` = flowrl ``token-mean`` with one mini-batch),
GRPO advantages ``(r - mean) / (std + eps)`` (TRL ``scale_rewards="group"``), fp32 and no gradient
checkpointing (TRL's defaults are bf16 and checkpointing on). Variants change the optimizer's betas
and the learning-rate schedule (TRL's default is transformers' linear decay to 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, package_versions, table, write_json  # noqa: E402

FRAMEWORKS = ("flowrl", "trl")
# 0.65M parameters: the issue's model (hidden 128, 4 layers, 8 heads of 16, 4 KV heads).
MODEL = dict(arch="qwen2", hidden_size=128, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=288,
             tie_word_embeddings=True)
NUM_HELDOUT = 256
CHILD_TIMEOUT_S = 4 * 3600.0
CHILD_ENV = {
    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
    "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
}


@dataclass(frozen=True, kw_only=True)
class Settings:
    """One benchmark configuration; both frameworks get every field."""

    steps: int = 300
    num_prompts: int = 16
    group_size: int = 8
    response_length: int = 8
    temperature: float = 1.0
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lr_schedule: str = "constant"  # constant | linear (TRL's default) | cosine
    clip_eps: float = 0.2


# Variant name -> Settings fields that differ from the defaults above.
VARIANTS: dict[str, dict[str, Any]] = {
    "aligned": {},  # TRL's betas, constant learning rate on both sides
    "linear": {"lr_schedule": "linear"},  # TRL's default schedule, on both sides
    "betas099": {"betas": (0.9, 0.99)},  # flowrl's former default betas, on both sides
    "cosine": {"lr_schedule": "cosine"},  # verl's cosine (min_lr_ratio 0, no warm-up)
}

# TRL GRPOConfig defaults (trl 1.16) that differ from flowrl's and are overridden in trl_settings().
ALIGNED = {
    "bf16": "True -> False (flowrl trains fp32 on CPU)",
    "gradient_checkpointing": "True -> False (flowrl never recomputes activations; same math)",
    "learning_rate": "1e-6 -> Settings.lr",
    "lr_scheduler_type": "linear -> Settings.lr_schedule (flowrl: actor.optim.lr_scheduler_type, default constant)",
    "adam_beta2": "0.999 (flowrl's default was 0.99 before this benchmark; set from Settings.betas)",
    "shuffle_dataset": "True -> False (both read the per-seed order written to the Parquet file)",
    "seed": "42 -> the run's seed",
    "optim": "adamw_torch_fused -> adamw_torch (same update; the fused kernel is for accelerators)",
    "top_k": "0 (= off) == flowrl rollout.top_k=-1; top_p 1.0 on both",
    "loss_type": "dapo == flowrl token-mean with one mini-batch per step",
    "scale_rewards": "group: (r - mean) / (std + 1e-4), std with n-1; flowrl GRPO: std + 1e-6",
}


# --------------------------------------------------------------------------- inputs
def prepare(workdir: Path, *, warmup_target: float | None = 0.4, seed: int = 0, model_kwargs: dict | None = None,
            max_warmup_steps: int = 1500) -> dict[str, Any]:
    """The warmed-up start model (cached in ``workdir/model``); returns the task record (model
    dir, warm-up, the start policy's evaluation). Tests pass a smaller model and warm-up."""
    record_path = workdir / "model" / "bench_task.json"
    model_kwargs = MODEL if model_kwargs is None else model_kwargs
    key = {"model": model_kwargs, "warmup_target": warmup_target, "seed": seed, "num_heldout": NUM_HELDOUT}
    if max_warmup_steps != 1500:
        key["max_warmup_steps"] = max_warmup_steps
    if record_path.exists() and (record := json.loads(record_path.read_text()))["key"] == key:
        return record
    from flowrl.tasks.arithmetic import make_addition_rows, make_sft_rows, split_pairs, write_rows
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, count_parameters
    from flowrl.tasks.warmup import WarmupConfig, evaluate_accuracy, sft_warm_up

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, **model_kwargs, seed=seed)
    model.save_pretrained(workdir / "init_model")
    num_pairs = len(split_pairs("train"))
    demos = write_rows(workdir / "sft.parquet", make_sft_rows(num_pairs, seed, "train"))
    config = WarmupConfig(target_greedy_accuracy=warmup_target, max_steps=max_warmup_steps)
    probe_rows = make_addition_rows(config.num_probe_rows, seed, "train")
    model_dir = workdir / "model"
    result = sft_warm_up(workdir / "init_model", str(demos), config, seed=seed, out_dir=model_dir,
                         probe=lambda m: evaluate_accuracy(m, tokenizer, probe_rows, num_samples=1, temperature=0.0))
    tokenizer.save_pretrained(model_dir)
    start = evaluate_policy(str(model_dir), str(model_dir), heldout_rows())
    record = {"key": key, "model_dir": str(model_dir), "num_parameters": count_parameters(model),
              "warmup": dataclasses.asdict(result), "start": start}
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def heldout_rows() -> list[dict]:
    """The 256 held-out prompts (test split: pairs never in a train file or the warm-up)."""
    from flowrl.tasks.arithmetic import make_addition_rows

    return make_addition_rows(NUM_HELDOUT, 0, "test")


def write_train_parquet(path: Path, seed: int, num_rows: int) -> Path:
    """Train prompts in the order of ``seed`` (both frameworks read them in file order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flowrl.tasks.arithmetic import make_addition_rows, split_pairs

    pool = make_addition_rows(len(split_pairs("train")), 1000 + seed, "train")
    rows = [pool[i % len(pool)] for i in range(num_rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------- the one evaluator
def evaluate_policy(model_dir: str, start_dir: str, rows: Sequence[dict], *, num_samples: int = 4,
                    seed: int = 0) -> dict[str, float]:
    """Greedy and sampled accuracy on ``rows``, and on answers sampled at temperature 1 from the
    model in ``model_dir``: mean token entropy and KL(model || start model) per response token
    (k1: ``logp - logp_start`` of the sampled tokens, EOS included, padding after it excluded)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flowrl.tasks.warmup import evaluate_accuracy, prompt_texts, torch_threads

    tokenizer = AutoTokenizer.from_pretrained(start_dir)  # the shared tokenizer (flowrl's save_hf writes weights only)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    start = AutoModelForCausalLM.from_pretrained(start_dir, dtype=torch.float32).eval()
    with torch_threads(1):
        greedy = evaluate_accuracy(model, tokenizer, rows, num_samples=1, temperature=0.0)
        sampled = evaluate_accuracy(model, tokenizer, rows, num_samples=num_samples, temperature=1.0, seed=seed)
        tokenizer.padding_side = "left"
        enc = tokenizer(prompt_texts(tokenizer, rows), return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            seq_BT = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=8,
                                    num_return_sequences=num_samples, pad_token_id=tokenizer.pad_token_id,
                                    eos_token_id=tokenizer.eos_token_id)
            prompt_len = enc["input_ids"].shape[1]
            attn_BT = torch.cat([enc["attention_mask"].repeat_interleave(num_samples, 0),
                                 torch.ones_like(seq_BT[:, prompt_len:])], dim=1)
            resp_BR = seq_BT[:, prompt_len:]
            is_eos = (resp_BR == tokenizer.eos_token_id).int()
            mask_BR = (is_eos.cumsum(1) - is_eos) == 0  # up to and including the first EOS
            logp, ent = _response_logprobs(model, seq_BT, attn_BT, prompt_len, with_entropy=True)
            logp0, _ = _response_logprobs(start, seq_BT, attn_BT, prompt_len, with_entropy=False)
    n = mask_BR.sum().clamp(min=1)
    return {
        "greedy_accuracy": greedy,
        "sampled_accuracy": sampled,
        "entropy": float((ent * mask_BR).sum() / n),
        "kl_to_start": float(((logp - logp0) * mask_BR).sum() / n),
        "response_length": float(mask_BR.sum() / mask_BR.shape[0]),
    }


def _response_logprobs(model: Any, seq_BT: Any, attn_BT: Any, prompt_len: int, *, with_entropy: bool) -> Any:
    """Log-probs of the response tokens of ``seq_BT`` (and the entropies at those positions)."""
    import torch

    position_BT = (attn_BT.cumsum(1) - 1).clamp(min=0)
    logits_BTV = model(input_ids=seq_BT, attention_mask=attn_BT, position_ids=position_BT).logits.float()
    logp_BRV = torch.log_softmax(logits_BTV[:, prompt_len - 1 : -1], dim=-1)
    logp_BR = logp_BRV.gather(-1, seq_BT[:, prompt_len:, None]).squeeze(-1)
    entropy_BR = -(logp_BRV.exp() * logp_BRV).sum(-1) if with_entropy else None
    return logp_BR, entropy_BR


# --------------------------------------------------------------------------- flowrl child
def flowrl_overrides(spec: dict[str, Any]) -> list[str]:
    """The flowrl command line of a run (everything the benchmark sets, flowrl's names)."""
    s = spec["settings"]
    return [
        f"model.path={spec['model_dir']}", f"data.train_files={spec['train_path']}", "data.shuffle=false",
        f"data.train_batch_size={s['num_prompts']}", f"rollout.n={s['group_size']}",
        f"rollout.response_length={s['response_length']}", f"rollout.temperature={s['temperature']}",
        "rollout.top_p=1.0", "rollout.top_k=-1", "rollout.data_parallel_size=1", "actor.data_parallel_size=1",
        f"actor.optim.lr={s['lr']}", f"actor.optim.betas=[{s['betas'][0]}, {s['betas'][1]}]",
        f"actor.optim.eps={s['eps']}", f"actor.optim.weight_decay={s['weight_decay']}",
        f"actor.optim.grad_clip={s['grad_clip']}", f"actor.optim.lr_scheduler_type={s['lr_schedule']}",
        f"actor.clip_ratio_low={s['clip_eps']}", f"actor.clip_ratio_high={s['clip_eps']}",
        f"actor.ppo_mini_batch_size={s['num_prompts']}", "actor.use_kl_loss=false", "actor.entropy_coeff=0.0",
        "actor.loss_agg_mode=token-mean", "algorithm.adv_estimator=grpo",
        f"trainer.total_training_steps={s['steps']}", f"trainer.seed={spec['seed']}",
        f"trainer.run_dir={spec['run_dir']}", "trainer.resume_mode=disable", "trainer.save_freq=0",
        "trainer.test_freq=0", "trainer.progress=false", "trainer.save_experience=false", "trainer.logger=[jsonl]",
        # a loaded shared machine starts workers slowly; loopback only, so no TLS (no effect on learning)
        "cluster.startup_timeout_s=3600", "cluster.timeout_s=3600", "cluster.tls=false",
    ]


def run_flowrl(spec: dict[str, Any]) -> list[dict[str, float]]:
    """Train through the notebook API; the final weights go to ``spec['final_dir']``."""
    from flowrl.config import load_config
    from flowrl.run import Run, resolve_inputs

    run = Run.open(resolve_inputs(load_config(None, flowrl_overrides(spec))))
    curve = []
    try:
        for _ in range(spec["settings"]["steps"]):
            _, m = run.step()
            curve.append({"reward": m["critic/score/mean"], "entropy": m.get("actor/entropy", float("nan")),
                          "lr": m.get("actor/lr", float("nan")), "grad_norm": m.get("actor/grad_norm", float("nan")),
                          "response_length": m.get("response_length/mean", float("nan"))})
        run.sync.collect()  # the last update's weights are what the actor holds anyway
        run.groups["actor"].bind().run("save_hf", kwargs={"directory": spec["final_dir"]})
    finally:
        run.close()
    return curve


# --------------------------------------------------------------------------- TRL child
def trl_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """GRPOConfig keyword arguments (TRL's defaults that differ from flowrl's, set equal: ``ALIGNED``)."""
    s = spec["settings"]
    return dict(
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, report_to=[], disable_tqdm=True,
        logging_steps=1, save_strategy="no", dataloader_num_workers=0, dataloader_pin_memory=False,
        seed=spec["seed"], data_seed=spec["seed"], shuffle_dataset=False, optim="adamw_torch",
        per_device_train_batch_size=s["num_prompts"] * s["group_size"], gradient_accumulation_steps=1,
        num_generations=s["group_size"], num_iterations=1, max_completion_length=s["response_length"],
        temperature=s["temperature"], top_p=1.0, top_k=0, beta=0.0, epsilon=s["clip_eps"], loss_type="dapo",
        scale_rewards="group", learning_rate=s["lr"], adam_beta1=s["betas"][0], adam_beta2=s["betas"][1],
        adam_epsilon=s["eps"], weight_decay=s["weight_decay"], max_grad_norm=s["grad_clip"],
        lr_scheduler_type=s["lr_schedule"], warmup_steps=0, log_completions=False, max_steps=s["steps"],
    )


def addition_reward(completions: list, ground_truth: list[str], data_source: list[str], **_: Any) -> list[float]:
    """flowrl's reward function (exact match of the decoded response) in TRL's signature."""
    from flowrl.rewards import resolve_reward_fn, split_score

    fn = resolve_reward_fn("auto")
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [split_score(fn(src, text, truth, None))[0] for text, truth, src in zip(texts, ground_truth, data_source)]


def run_trl(spec: dict[str, Any]) -> list[dict[str, float]]:
    import pyarrow.parquet as pq
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    rows = pq.read_table(spec["train_path"]).to_pylist()
    data = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"],
                               "data_source": r["data_source"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    args = GRPOConfig(output_dir=spec["run_dir"], **trl_settings(spec))
    trainer = GRPOTrainer(model=model, reward_funcs=[addition_reward], args=args, train_dataset=data,
                          processing_class=tokenizer)
    trainer.train()
    trainer.model.save_pretrained(spec["final_dir"])
    tokenizer.save_pretrained(spec["final_dir"])
    logs = [h for h in trainer.state.log_history if "reward" in h]
    return [{"reward": h["reward"], "entropy": h.get("entropy", float("nan")), "lr": h.get("learning_rate", float("nan")),
             "grad_norm": h.get("grad_norm", float("nan")),
             "response_length": h.get("completions/mean_length", float("nan"))} for h in logs]


def child_main(spec: dict[str, Any]) -> None:
    """One run: train, evaluate the final weights, write the result JSON."""
    start = time.perf_counter()
    curve = (run_flowrl if spec["framework"] == "flowrl" else run_trl)(spec)
    train_s = time.perf_counter() - start
    Path(spec["result_path"]).with_suffix(".curve.json").write_text(json.dumps(curve) + "\n")  # kept if eval fails
    evaluation = evaluate_policy(spec["final_dir"], spec["model_dir"], heldout_rows(), seed=spec["seed"])
    result = {"framework": spec["framework"], "variant": spec["variant"], "seed": spec["seed"],
              "settings": spec["settings"], "train_s": train_s, "eval": evaluation, "curve": curve}
    Path(spec["result_path"]).write_text(json.dumps(result) + "\n")


# --------------------------------------------------------------------------- driver
def job_spec(workdir: Path, task: dict[str, Any], variant: str, framework: str, seed: int,
             settings: Settings) -> dict[str, Any]:
    name = f"{framework}_s{seed}"
    vdir = workdir / variant
    return {
        "framework": framework, "variant": variant, "seed": seed, "settings": dataclasses.asdict(settings),
        "model_dir": task["model_dir"], "run_dir": str(vdir / f"run_{name}"), "final_dir": str(vdir / f"final_{name}"),
        "train_path": str(workdir / "data" / f"train_s{seed}_{settings.steps * settings.num_prompts}.parquet"),
        "result_path": str(vdir / f"{name}.json"), "log_path": str(vdir / f"{name}.log"),
    }


def run_jobs(specs: list[dict[str, Any]], num_jobs: int) -> None:
    """Run the children whose result file is missing, ``num_jobs`` at a time."""
    todo = [s for s in specs if not Path(s["result_path"]).exists()]
    running: list[tuple[dict[str, Any], subprocess.Popen, float, Any]] = []
    try:
        _run_all(todo, running, num_jobs)
    finally:  # interrupted (Ctrl-C, a test's timeout): no child outlives the driver
        for _, proc, _, log in running:
            proc.kill()
            proc.wait(30)
            log.close()


def _run_all(todo: list[dict[str, Any]], running: list, num_jobs: int) -> None:
    while todo or running:
        while todo and len(running) < num_jobs:
            spec = todo.pop(0)
            Path(spec["log_path"]).parent.mkdir(parents=True, exist_ok=True)
            log = open(spec["log_path"], "w")
            argv = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **CHILD_ENV})
            running.append((spec, proc, time.perf_counter(), log))
            print(f"started {spec['variant']} {spec['framework']} seed {spec['seed']}", flush=True)
        time.sleep(2.0)
        for item in list(running):
            spec, proc, began, log = item
            late = time.perf_counter() - began > CHILD_TIMEOUT_S
            if proc.poll() is None and not late:
                continue
            if late:
                proc.kill()
                proc.wait(30)
            running.remove(item)
            log.close()
            ok = proc.returncode == 0 and Path(spec["result_path"]).exists()
            print(f"{'done' if ok else 'FAILED'} {spec['variant']} {spec['framework']} seed {spec['seed']} "
                  f"({time.perf_counter() - began:.0f}s){'' if ok else '; see ' + spec['log_path']}", flush=True)


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else float("nan"))


def summarize(results: list[dict[str, Any]], last: int = 30) -> list[dict[str, Any]]:
    """Per (variant, framework): held-out accuracy per seed, mean and sample std; the mean sampled
    reward of the last ``last`` steps, entropy and KL to the start policy (means over seeds)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in sorted(results, key=lambda r: (r["variant"], r["framework"], r["seed"])):
        groups.setdefault((r["variant"], r["framework"]), []).append(r)
    rows = []
    for (variant, fw), rs in groups.items():
        acc = [r["eval"]["greedy_accuracy"] for r in rs]
        mean, std = _mean_std(acc)
        tail = [statistics.fmean(p["reward"] for p in r["curve"][-last:]) for r in rs if r["curve"]]
        rows.append({
            "variant": variant, "framework": fw, "seeds": [r["seed"] for r in rs], "heldout_greedy": acc,
            "heldout_mean": mean, "heldout_std": std,
            "heldout_sampled_mean": _mean_std([r["eval"]["sampled_accuracy"] for r in rs])[0],
            "train_reward_last": _mean_std(tail)[0], "train_reward_last_std": _mean_std(tail)[1],
            "entropy": _mean_std([r["eval"]["entropy"] for r in rs])[0],
            "kl_to_start": _mean_std([r["eval"]["kl_to_start"] for r in rs])[0],
            "reward_curve_mean": _curve_mean(rs, "reward"), "entropy_curve_mean": _curve_mean(rs, "entropy"),
            "train_s_mean": _mean_std([r["train_s"] for r in rs])[0],
        })
    return rows


def _curve_mean(rs: list[dict[str, Any]], key: str, bucket: int = 10) -> list[float]:
    """The per-step curve averaged over seeds and over buckets of ``bucket`` steps."""
    n = min(len(r["curve"]) for r in rs)
    per_step = [statistics.fmean(r["curve"][i][key] for r in rs) for i in range(n)]
    return [statistics.fmean(per_step[i : i + bucket]) for i in range(0, n, bucket)]


def report(task: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    head = (f"start model: {task['num_parameters']} parameters, held-out greedy {task['start']['greedy_accuracy']:.3f}, "
            f"sampled {task['start']['sampled_accuracy']:.3f}, entropy {task['start']['entropy']:.3f}")
    body = table(
        ["variant", "framework", "held-out greedy per seed", "mean", "std", "sampled", "reward last 30", "entropy",
         "KL to start", "train s"],
        [[r["variant"], r["framework"], " ".join(f"{a:.3f}" for a in r["heldout_greedy"]), r["heldout_mean"],
          r["heldout_std"], r["heldout_sampled_mean"], r["train_reward_last"], r["entropy"], r["kl_to_start"],
          r["train_s_mean"]] for r in rows])
    return head + "\n" + body


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["aligned"], choices=sorted(VARIANTS))
    p.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=Settings.steps)
    p.add_argument("--jobs", type=int, default=2, help="children at once")
    p.add_argument("--warmup-target", type=float, default=0.4,
                   help="greedy accuracy on train probe prompts at which the warm-up stops")
    p.add_argument("--workdir", default="runs/learning_vs_trl", help="start model, prompts, runs (cached)")
    p.add_argument("--out", default="benchmarks/results/learning_vs_trl.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return None
    if args.steps < 1 or args.jobs < 1:
        raise ValueError("--steps and --jobs must be at least 1")
    workdir = Path(args.workdir)
    task = prepare(workdir, warmup_target=args.warmup_target)
    print(f"start model {task['model_dir']}: {task['start']}", flush=True)
    specs = []
    for seed in args.seeds:  # seed-major: every variant's first seed comes first
        for variant in args.variants:
            settings = dataclasses.replace(Settings(steps=args.steps), **VARIANTS[variant])
            for fw in args.frameworks:
                spec = job_spec(workdir, task, variant, fw, seed, settings)
                if not Path(spec["train_path"]).exists():
                    write_train_parquet(Path(spec["train_path"]), seed, settings.steps * settings.num_prompts)
                specs.append(spec)
    start = time.perf_counter()
    run_jobs(specs, args.jobs)
    results = [json.loads(Path(s["result_path"]).read_text()) for s in specs if Path(s["result_path"]).exists()]
    rows = summarize(results)
    print(report(task, rows), flush=True)
    out = {
        "benchmark": "learning_vs_trl", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine_info(),
        "versions": package_versions(["flowrl", "trl", "torch", "transformers", "accelerate", "datasets"]),
        "start_model": task, "aligned_trl_defaults": ALIGNED, "summary": rows, "runs": results,
        "wall_s": time.perf_counter() - start,
    }
    write_json(out, args.out)
    return out


if __name__ == "__main__":
    main()

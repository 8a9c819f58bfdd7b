"""flowrl vs TRL's ``GRPOTrainer``: seconds per GRPO step and generated tokens/s on CPU.

Both frameworks train the same model directory (weights + tokenizer) on the same prompts with the
same group size, response length, sampling temperature, optimizer (AdamW: lr, betas, eps, no weight
decay, grad-norm clip 1.0), KL coefficient 0 (no reference model on either side) and one optimizer
step per generated batch. Each gets the whole machine while it runs: TRL as one process with 2
torch threads, flowrl as its default 2 rollout + 2 actor worker processes of 1 thread each.

Both run in long-lived processes started once (startup is not timed) and take turns, K steps at a
time, in ABBA order (flowrl, trl, trl, flowrl, ...), after untimed warm-up steps. One step's time is
measured from inside each framework and covers generation + reward + advantages + update:
flowrl's ``timing_s/step`` (the whole iteration graph, weight sync to the rollout workers included)
and, for TRL, a ``TrainerCallback`` from ``on_step_begin`` to ``on_step_end`` (generation, scoring,
forward/backward, clipping and the optimizer step; logging and the prompt loader fall outside, as
flowrl's logging does). The machine may be shared: every turn records how many cores other work
kept busy meanwhile, and the "quiet" ratio uses only turns where that stayed near zero. Under load
TRL's 2-thread process slows down far more than flowrl's 1-thread processes, so loaded turns favour
flowrl.

    python benchmarks/vs_trl.py --scale both --repeats 3 --out benchmarks/results/vs_trl.json
    python benchmarks/vs_trl.py --scale grid --repeats 2     # issue 14's grid -> results/vs_trl_grid.json

The grid (:data:`GRID`): 0.13M and 10.7M parameters x 128 and 1024 samples per step (prompts x 16)
x 8 and 128 new tokens; EOS is tuned (:func:`spread_eos`) so responses stop at spread lengths, half
the budget on average. flowrl runs at its defaults, no speed flags (issue 30: ``use_dynamic_bsz`` and
``use_prefix_grouper`` are ``auto``, resolved by ``flowrl.config.batching_auto``); ``--flowrl-flags
KEY=VALUE ...`` adds keys to flowrl's side for a comparison with explicit settings. The grid
table prints, per cell, both step times and their ratio, each side's generation time and the rest,
flowrl's update and weight sync, and both sides' padding ratios (decode, train).

Scales: ``default`` is the ``default`` preset (the default task's architecture, 0.13M parameters,
random init), 8-token responses, 64 prompts x 16 samples (the default config's batch); ``large`` is the ``10m`` preset (10.7M parameters, random init)
with 64-token responses, 4 prompts x 8 samples. At random init the 10m model now and then samples EOS
(16 of 256 responses stopped early), so :func:`suppress_eos` pushes EOS's logit down and every
response runs to 64 tokens.
Neither model ever earns a reward here (all advantages are 0); the update still does the full
forward, backward and optimizer step, which is what is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Channel, Child, machine_info, median, package_versions, table  # noqa: E402

_PROCESS_START = time.perf_counter()
FRAMEWORKS = ("flowrl", "trl")
TRL_THREADS = 2
STARTUP_TIMEOUT_S = 600.0
# flowrl metrics kept per step: per-node wall time, in-worker time, and the actor's own update loop.
BREAKDOWN_PREFIXES = ("timing_s/", "compute_s/", "actor/update_s", "perf/")
# A turn is "quiet" when other work kept at most this many cores busy on average meanwhile.
QUIET_FOREIGN_CORES = 0.2
BLOCK_TIMEOUT_S = 900.0
# Offline, no telemetry, no tokenizer thread pools fighting the torch threads.
CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass(frozen=True, kw_only=True)
class Scale:
    """One benchmark size. Everything else is shared (see :class:`Common`)."""

    preset: str  # key of flowrl.models.tiny.TINY_PRESETS
    max_position_embeddings: int  # must hold the 6-token prompt plus the response
    response_length: int
    num_prompts: int  # prompts per step (data.train_batch_size); each sampled `group_size` times
    group_size: int = 8  # rollout.n == num_generations
    steps_per_block: int  # K: timed steps per turn
    suppress_eos: bool = False  # push EOS's logit down so every response runs to response_length
    spread_eos: float = 0.0  # > 0: EOS tuned so responses average this fraction of response_length (a spread)

    @property
    def num_samples(self) -> int:
        return self.num_prompts * self.group_size


SCALES = {
    "default": Scale(preset="default", max_position_embeddings=64, response_length=8, num_prompts=64, group_size=16, steps_per_block=6),
    "large": Scale(
        preset="10m", max_position_embeddings=128, response_length=64, num_prompts=4, steps_per_block=3, suppress_eos=True
    ),
}


def _grid_cell(preset: str, samples: int, tokens: int) -> Scale:
    """One grid cell: ``samples`` per step as prompts x 16, responses stopping at spread lengths
    (EOS tuned to half the budget on average); flowrl at its defaults."""
    steps = 1 if (preset == "10m" and samples * tokens >= 128 * 128) else (2 if preset == "10m" or samples * tokens > 8192 else 4)
    return Scale(preset=preset, max_position_embeddings=tokens + 16, response_length=tokens, num_prompts=samples // 16,
                 group_size=16, steps_per_block=steps, spread_eos=0.5)


# The issue-14 grid: 0.13M and 10.7M parameters x 128 and 1024 samples per step x 8 and 128 new
# tokens, lengths spread; "smoke" is a seconds-long cell for the tests.
GRID = {f"{'0.1M' if p == 'default' else '10M'}-{n}x{t}": _grid_cell(p, n, t)
        for p in ("default", "10m") for n in (128, 1024) for t in (8, 128)}
SCALES.update(GRID)
SCALES["smoke"] = Scale(preset="default", max_position_embeddings=24, response_length=8, num_prompts=2, group_size=8,
                        steps_per_block=1, spread_eos=0.5)


@dataclass(frozen=True, kw_only=True)
class Common:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    grad_clip: float = 1.0
    temperature: float = 1.0
    kl_beta: float = 0.0
    clip_eps: float = 0.2
    num_train_prompts: int = 1024
    seed: int = 0


NOTES = [
    "Same model directory, tokenizer, prompts (the two-digit addition task, verl parquet, chat template applied by "
    "both: identical 6-token prompt ids), group size, max completion length, temperature 1.0 (no top-k/top-p), "
    "AdamW lr/betas/eps, weight decay 0, grad-norm clip 1.0, KL beta 0 (no reference model), PPO clip 0.2, "
    "one optimizer step per generated batch (TRL: per_device_train_batch_size = prompts x group size, "
    "gradient_accumulation_steps 1, num_iterations 1, so no old-logprob pass on either side).",
    "TRL is run in fp32 without gradient checkpointing (its defaults are bf16 and gradient checkpointing on): "
    "flowrl trains in fp32 and never recomputes activations, CPU bf16 matmuls are not faster here, and "
    "checkpointing would add a forward pass to TRL's update. Constant learning rate (TRL defaults to linear decay; "
    "no effect on time).",
    "flowrl runs at its defaults (no speed flags): batching auto (issue 30) forms micro-batches by a token "
    "budget derived from the micro-batch rows and lengths (actor.use_dynamic_bsz=auto) and computes each prompt "
    "once per group of rollout.n rows where that saves a tenth of the positions (actor.use_prefix_grouper=auto); "
    "what auto chose is in flowrl's run directory (config.yaml). flowrl_overrides lists any --flowrl-flags. "
    "TRL has neither layout.",
    "Loss: TRL loss_type 'dapo' (token mean over the batch's completion tokens) = flowrl token-mean with one "
    "mini-batch; TRL scale_rewards 'group' = flowrl GRPO std normalisation.",
    "Step time: flowrl timing_s/step (whole iteration graph incl. weight sync trainer->rollout); TRL "
    "on_step_begin->on_step_end callback (generation, reward, advantages, forward/backward, clip, optimizer step). "
    "block_wall_s also counts what happens between steps (logging, prompt loading) for both.",
    "Threads: TRL one process with torch.set_num_threads(2); flowrl its defaults: cluster.placement=auto (here "
    "hybrid: 2 worker processes with 1 thread each, each holding trainer and generator on the same module) and "
    "cluster.controller=auto (here driver: the iteration graph runs on Dask's threaded scheduler in the driver, "
    "which calls the rank actors directly).",
    "Sampling differs between the two (different RNG streams), so response lengths differ slightly; "
    "generated tokens/s accounts for that. Tokens count every sampled token up to and including EOS.",
    "large scale: the saved 10m model has EOS pushed down (suppress_eos: +2.0 on embedding feature 0 of every "
    "token, -2.0 for EOS; tied embeddings) so responses run to 64 tokens on both sides. Random-init models never "
    "earn a reward, so advantages are 0; both still run the full forward/backward/optimizer step.",
    "While one framework runs, the other waits: TRL blocked on its stdin (no CPU), flowrl's idle Dask "
    "cluster (scheduler, nannies, workers) ticking at ~0.1-0.2 of a core (blocks[].idle_cores), which TRL's "
    "turns have to share.",
    "Shared machine: other users' processes compete for the 2 cores. Under contention a 2-thread OpenMP process "
    "(TRL) loses more than two 1-thread processes (flowrl), because each parallel region waits for its slower "
    "thread. blocks[].foreign_cores is the average number of cores other work kept busy during a turn (from "
    "/proc/stat minus both frameworks' process trees); 'quiet' statistics keep turns with at most "
    f"{QUIET_FOREIGN_CORES} such cores. Ratios from quiet turns are the reference.",
    "flowrl does work TRL does not: it keeps the sampled tokens' log-probs from generation (output_logits). "
    "TRL decodes every row until the longest finishes; flowrl's decode retires finished rows.",
]


# --------------------------------------------------------------------------- inputs
def prepare_inputs(scale: Scale, common: Common, workdir: Path) -> tuple[Path, Path]:
    """Save the random-init model + tokenizer and write the prompt parquet; return (model_dir, train.parquet)."""
    from flowrl.tasks.arithmetic import write_addition_parquet
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import TINY_PRESETS, build_tiny_model

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer, **TINY_PRESETS[scale.preset], max_position_embeddings=scale.max_position_embeddings, seed=common.seed
    )
    if scale.suppress_eos:
        suppress_eos(model, tokenizer.eos_token_id)
    if scale.spread_eos > 0:
        spread_eos(model, tokenizer.eos_token_id, scale.spread_eos * scale.response_length, scale.response_length)
    model_dir = workdir / f"model_{scale.preset}"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    train_path, _ = write_addition_parquet(workdir / "data", common.num_train_prompts, 0, common.seed)
    return model_dir, train_path


def suppress_eos(model: Any, eos_id: int, offset: float = 2.0) -> None:
    """Make EOS (practically) never sampled: add ``offset`` to feature 0 of every token embedding
    and set EOS's to ``-offset``. With tied embeddings the final hidden state then leans along
    feature 0, which raises every logit alike except EOS's. For the 10m preset at random init and
    full-distribution sampling (no top-k), p(EOS) per position falls from 0.2% on average (0.97 at
    worst; 16 of 256 responses stopped early) to 3e-8 (at most 2e-7); the other tokens stay close
    to uniform."""
    import torch

    if not model.config.tie_word_embeddings:
        raise ValueError("suppress_eos needs tied input/output embeddings")
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        weight[:, 0] += offset
        weight[eos_id, 0] = -offset


def spread_eos(model: Any, eos_id: int, target_mean: float, max_new: int, *, iters: int = 10) -> float:
    """Tune EOS so sampled responses stop at different lengths, ``target_mean`` tokens on average:
    feature 0 of every embedding gets +2 (as :func:`suppress_eos`) and EOS's feature 0 a value
    ``c`` found by bisection on the mean length of 64 samples (flowrl's decode, seeded). Returns
    the mean length reached."""
    import torch

    from flowrl.backends.generate.hf_decode import decode
    from flowrl.backends.interfaces import SamplingParams

    suppress_eos(model, eos_id)
    weight = model.get_input_embeddings().weight
    prompts = torch.randint(3, weight.shape[0], (8, 6), generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(n=8, max_new_tokens=max_new)
    lo, hi, mean = -2.0, 16.0, float(max_new)
    for _ in range(iters):
        mid = (lo + hi) / 2
        with torch.no_grad():
            weight[eos_id, 0] = mid
        torch.manual_seed(0)
        responses, _, _ = decode(model, prompts, params, eos_ids={eos_id}, pad_id=0)
        mean = sum(len(r) for r in responses) / len(responses)
        lo, hi = (mid, hi) if mean > target_mean else (lo, mid)
    return mean


# --------------------------------------------------------------------------- flowrl child
def flowrl_overrides(spec: dict[str, Any]) -> list[str]:
    s, c = spec["scale"], spec["common"]
    return [
        f"model.path={spec['model_dir']}",
        f"data.train_files={spec['train_path']}",
        f"data.train_batch_size={s['num_prompts']}",
        f"rollout.n={s['group_size']}",
        f"rollout.response_length={s['response_length']}",
        f"rollout.temperature={c['temperature']}",
        f"actor.optim.lr={c['lr']}",
        f"actor.optim.betas=[{c['betas'][0]}, {c['betas'][1]}]",
        f"actor.optim.eps={c['eps']}",
        "actor.optim.weight_decay=0.0",
        f"actor.optim.grad_clip={c['grad_clip']}",
        f"actor.clip_ratio_low={c['clip_eps']}",
        f"actor.clip_ratio_high={c['clip_eps']}",
        f"actor.ppo_mini_batch_size={s['num_prompts']}",
        f"actor.use_kl_loss={'true' if c['kl_beta'] > 0 else 'false'}",
        f"actor.kl_loss_coef={c['kl_beta']}",
        "actor.loss_agg_mode=token-mean",
        f"trainer.seed={c['seed']}",
        f"trainer.run_dir={spec['run_dir']}",
        "trainer.progress=false",
        "trainer.save_experience=false",
    ] + list(spec.get("flowrl_flags", []))  # none by default: flowrl's speed settings at their defaults (issue 30)


def serve_flowrl(spec: dict[str, Any]) -> None:
    from flowrl.config import load_config
    from flowrl.run import Run, resolve_inputs

    channel = Channel()
    start = _PROCESS_START
    run = Run.open(resolve_inputs(load_config(None, flowrl_overrides(spec))))
    try:
        channel.reply({"ready": True, "startup_s": time.perf_counter() - start})
        while (num_steps := channel.command()) is not None:
            block_start = time.perf_counter()
            steps = []
            for _ in range(num_steps):
                _, m = run.step()
                steps.append({
                    "step_s": m["timing_s/step"],
                    "tokens": m["num_response_tokens"],
                    "mean_len": m["response_length/mean"],
                    "gen_s": m["timing_s/gen"],
                    "rest_s": m["timing_s/step"] - m["timing_s/gen"],
                    "score": m["critic/score/mean"],
                    "breakdown": {k: v for k, v in m.items() if k.startswith(BREAKDOWN_PREFIXES)},
                })
            channel.reply({"steps": steps, "block_wall_s": time.perf_counter() - block_start})
    finally:
        run.close()


# --------------------------------------------------------------------------- TRL child
def trl_dataset(train_path: str) -> Any:
    """The parquet's rows as TRL wants them: conversational ``prompt`` plus reward columns."""
    import pyarrow.parquet as pq
    from datasets import Dataset

    rows = pq.read_table(train_path).to_pylist()
    return Dataset.from_list([
        {"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"], "data_source": r["data_source"]}
        for r in rows
    ])


def addition_reward(completions: list, ground_truth: list[str], data_source: list[str], **_: Any) -> list[float]:
    """flowrl's reward function (exact match of the decoded response) in TRL's signature."""
    from flowrl.rewards import resolve_reward_fn, split_score

    fn = resolve_reward_fn("auto")
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [split_score(fn(src, text, truth, None))[0] for text, truth, src in zip(texts, ground_truth, data_source)]


def trl_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """GRPOConfig keyword arguments (what the JSON reports as TRL's settings)."""
    s, c = spec["scale"], spec["common"]
    return dict(
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        report_to=[],
        disable_tqdm=True,
        logging_steps=1,
        save_strategy="no",
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        seed=c["seed"],
        per_device_train_batch_size=s["num_prompts"] * s["group_size"],
        gradient_accumulation_steps=1,
        num_generations=s["group_size"],
        num_iterations=1,
        max_completion_length=s["response_length"],
        temperature=c["temperature"],
        top_p=1.0,
        top_k=0,
        beta=c["kl_beta"],
        epsilon=c["clip_eps"],
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=c["lr"],
        adam_beta1=c["betas"][0],
        adam_beta2=c["betas"][1],
        adam_epsilon=c["eps"],
        weight_decay=0.0,
        max_grad_norm=c["grad_clip"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        log_completions=False,
    )


def serve_trl(spec: dict[str, Any]) -> None:
    import torch

    torch.set_num_threads(TRL_THREADS)
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    channel = Channel()
    start = _PROCESS_START
    max_steps = spec["total_steps"]

    class StepTimer(TrainerCallback):
        """Times on_step_begin -> on_step_end and hands control to the driver between blocks."""

        def __init__(self) -> None:
            self.steps: list[dict[str, Any]] = []
            self.remaining = 0
            self.block_start = 0.0
            self.step_start = 0.0
            self.probe: dict[str, float] = {}

        def _next_block(self, control: Any) -> None:
            num_steps = channel.command()
            if num_steps is None:
                control.should_training_stop = True
                return
            self.remaining, self.steps, self.block_start = num_steps, [], time.perf_counter()

        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            channel.reply({"ready": True, "startup_s": time.perf_counter() - start})
            self._next_block(control)

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.probe = {"gen_s": 0.0, "score_s": 0.0, "tokens": 0.0, "rows": 0.0}
            self.step_start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            step_s = time.perf_counter() - self.step_start
            p = self.probe
            pad = {k: p[k] for k in ("gen_padding_ratio", "train_padding_ratio") if k in p}
            self.steps.append({
                "step_s": step_s,
                "tokens": p["tokens"],
                "mean_len": p["tokens"] / max(p["rows"], 1.0),
                "gen_s": p["gen_s"],
                "rest_s": step_s - p["gen_s"],
                "score": p.get("score", float("nan")),
                "breakdown": {"generate_s": p["gen_s"], "generate_and_score_s": p["score_s"], **pad},
            })
            self.remaining -= 1
            if self.remaining == 0:
                channel.reply({"steps": self.steps, "block_wall_s": time.perf_counter() - self.block_start})
                if state.global_step < max_steps:
                    self._next_block(control)

    timer = StepTimer()
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    args = GRPOConfig(output_dir=spec["run_dir"], max_steps=max_steps, **trl_settings(spec))
    trainer = GRPOTrainer(
        model=model, reward_funcs=[addition_reward], args=args, train_dataset=trl_dataset(spec["train_path"]),
        processing_class=tokenizer, callbacks=[timer],
    )
    _instrument(trainer, timer)
    trainer.train()
    channel.command()  # wait for "stop"


def trl_padding(prompt_mask: Any, completion_mask: Any) -> dict[str, float]:
    """TRL's positions computed per real token, as flowrl counts them: decoding prefills every
    padded prompt and runs every row until the longest ends (a row's last token is never fed);
    training runs the padded ``[N, prompt + completion]`` batch."""
    rows, prompt_len = prompt_mask.shape
    longest = completion_mask.shape[1]
    prompt_tokens, tokens = float(prompt_mask.sum()), float(completion_mask.sum())
    fed = prompt_tokens + tokens - float((completion_mask.sum(1) > 0).sum())
    return {"gen_padding_ratio": rows * (prompt_len + max(longest - 1, 0)) / max(fed, 1.0),
            "train_padding_ratio": rows * (prompt_len + longest) / max(prompt_tokens + tokens, 1.0)}


def _instrument(trainer: Any, timer: Any) -> None:
    """Wrap the trainer's generation and scoring methods to time them and count sampled tokens."""
    generate, generate_and_score = trainer._generate_single_turn, trainer._generate_and_score_completions

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = generate(*args, **kwargs)
        timer.probe["gen_s"] += time.perf_counter() - t
        return out

    def timed_generate_and_score(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = generate_and_score(*args, **kwargs)
        timer.probe["score_s"] += time.perf_counter() - t
        mask = out["completion_mask"]
        timer.probe["tokens"] += float(mask.sum())
        timer.probe["rows"] += float(mask.shape[0])
        timer.probe.update(trl_padding(out["prompt_mask"], mask))
        rewards = trainer._metrics["train"].get("reward")
        if rewards:
            timer.probe["score"] = float(rewards[-1])
        return out

    trainer._generate_single_turn = timed_generate
    trainer._generate_and_score_completions = timed_generate_and_score


# --------------------------------------------------------------------------- driver
def bench_scale(
    name: str, scale: Scale, common: Common, *, repeats: int, warmup: int, steps_per_block: int, workdir: Path,
    flowrl_flags: tuple[str, ...] = (),
) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir, train_path = prepare_inputs(scale, common, workdir)
    spec = {
        "scale": dataclasses.asdict(scale) | {"steps_per_block": steps_per_block},
        "common": dataclasses.asdict(common),
        "model_dir": str(model_dir),
        "train_path": str(train_path),
        "total_steps": warmup + repeats * steps_per_block,
        "flowrl_flags": list(flowrl_flags),
    }
    children: dict[str, Child] = {}
    blocks: list[dict[str, Any]] = []
    startup: dict[str, float] = {}
    try:
        for fw in FRAMEWORKS:  # both start at once; startup is not timed
            fw_spec = {**spec, "run_dir": str(workdir / f"run_{fw}")}
            env = dict(CHILD_ENV)
            if fw == "trl":
                env |= {"OMP_NUM_THREADS": str(TRL_THREADS), "MKL_NUM_THREADS": str(TRL_THREADS)}
            argv = [sys.executable, str(Path(__file__).resolve()), "--serve", fw, "--spec", json.dumps(fw_spec)]
            children[fw] = Child(fw, argv, log_path=workdir / f"{fw}.log", env=env)
        for fw, child in children.items():
            startup[fw] = child.wait_reply(STARTUP_TIMEOUT_S)["startup_s"]
            print(f"[{name}] {fw} ready after {startup[fw]:.1f}s", flush=True)
        for fw, child in children.items():
            if warmup:
                child.run(warmup, BLOCK_TIMEOUT_S)
        for r in range(repeats):
            order = FRAMEWORKS if r % 2 == 0 else FRAMEWORKS[::-1]
            for fw in order:
                load_1m = os.getloadavg()[0]
                idle = [c for name, c in children.items() if name != fw]
                reply = children[fw].run(steps_per_block, BLOCK_TIMEOUT_S, idle=idle)
                blocks.append({"framework": fw, "repeat": r, "load_1m_before": load_1m, **reply})
                b = summarize_block(reply)
                print(f"[{name}] repeat {r} {fw:6s} {b['s_per_step']:.3f} s/step  {b['tokens_per_s']:.0f} tok/s  "
                      f"mean len {b['mean_len']:.1f}  CPU {b['cpu_s_per_step']:.2f} s/step", flush=True)
    finally:
        for child in children.values():
            child.stop()
    return {
        "settings": spec["scale"],
        "model_dir": str(model_dir),
        "startup_s": startup,
        "warmup_steps": warmup,
        "blocks": blocks,
        "summary": summarize(blocks),
    }


def summarize_block(block: dict[str, Any]) -> dict[str, float]:
    """Means over one turn's steps (tokens/s is total tokens over total step time)."""
    steps = block["steps"]
    k = len(steps)
    total_s = sum(s["step_s"] for s in steps)
    return {
        "s_per_step": total_s / k,
        "tokens_per_s": sum(s["tokens"] for s in steps) / total_s,
        "mean_len": sum(s["mean_len"] for s in steps) / k,
        "gen_s": sum(s["gen_s"] for s in steps) / k,
        "rest_s": sum(s["rest_s"] for s in steps) / k,
        "cpu_s_per_step": block.get("cpu_s", float("nan")) / k,
        "wall_s_per_step": block["block_wall_s"] / k,
        "foreign_cores": block.get("foreign_cores", float("nan")),
        "idle_cores": block.get("idle_cores", float("nan")),
    }


def summarize(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per framework: medians over turns, and the fastest single step (noise only ever adds time,
    so the minimum is the estimate least disturbed by other users); then the ratios."""
    per_fw: dict[str, Any] = {}
    for fw in FRAMEWORKS:
        mine = [b for b in blocks if b["framework"] == fw]
        sums = [summarize_block(b) for b in mine]
        steps = [s for b in mine for s in b["steps"]]
        fastest = min(steps, key=lambda s: s["step_s"])
        quiet = [x for x in sums if x["foreign_cores"] <= QUIET_FOREIGN_CORES]
        per_fw[fw] = {k: median([x[k] for x in sums]) for k in sums[0]} | {
            "s_per_step_blocks": [x["s_per_step"] for x in sums],
            "foreign_cores_blocks": [x["foreign_cores"] for x in sums],
            "num_quiet_blocks": len(quiet),
            "s_per_step_quiet": median([x["s_per_step"] for x in quiet]),
            "tokens_per_s_quiet": median([x["tokens_per_s"] for x in quiet]),
            "min_s_per_step": fastest["step_s"],
            "tokens_per_s_fastest_step": fastest["tokens"] / fastest["step_s"],
            "fastest_step": fastest,
            "breakdown_median_s": {k: median([s["breakdown"][k] for s in steps]) for k in steps[0]["breakdown"]},
        }
    pairs: dict[int, dict[str, float]] = {}
    for b in blocks:
        pairs.setdefault(b["repeat"], {})[b["framework"]] = summarize_block(b)["s_per_step"]
    pair_speedups = [p["trl"] / p["flowrl"] for p in pairs.values() if len(p) == 2]
    f, t = per_fw["flowrl"], per_fw["trl"]
    return {
        **per_fw,
        "speedup": t["s_per_step"] / f["s_per_step"],
        "speedup_per_repeat": pair_speedups,
        "speedup_median_of_repeats": median(pair_speedups),
        "speedup_fastest_step": t["min_s_per_step"] / f["min_s_per_step"],
        # NaN unless both frameworks had a turn with at most QUIET_FOREIGN_CORES of other load.
        "speedup_quiet": t["s_per_step_quiet"] / f["s_per_step_quiet"],
        "cpu_s_ratio_flowrl_over_trl": f["cpu_s_per_step"] / t["cpu_s_per_step"],
        "ratio_flowrl_over_trl_s_per_step": f["s_per_step"] / t["s_per_step"],
        "tokens_per_s_ratio_flowrl_over_trl": f["tokens_per_s"] / t["tokens_per_s"],
    }


def report(name: str, result: dict[str, Any]) -> str:
    s, cfg = result["summary"], result["settings"]
    rows = []
    for fw in FRAMEWORKS:
        x = s[fw]
        rows.append([
            fw, x["s_per_step"],
            " ".join(f"{v:.2f}@{max(c, 0.0):.1f}" for v, c in zip(x["s_per_step_blocks"], x["foreign_cores_blocks"])),
            x["s_per_step_quiet"], x["min_s_per_step"],
            x["tokens_per_s"], x["mean_len"], x["gen_s"], x["rest_s"], x["cpu_s_per_step"],
        ])
    lines = [
        f"scale {name}: preset {cfg['preset']}, {cfg['num_prompts']} prompts x {cfg['group_size']}, "
        f"response_length {cfg['response_length']}; {len(s['speedup_per_repeat'])} turns x {cfg['steps_per_block']} "
        f"steps each; medians over turns; per turn: s/step@cores busy with other work; 'quiet' = median of turns "
        f"with <= {QUIET_FOREIGN_CORES} other cores busy; 'min' = fastest single step",
        table(["framework", "s/step", "per turn", "quiet s/step", "min s/step", "gen tok/s", "mean len", "gen s",
               "other s", "CPU s/step"], rows),
        f"speedup = trl s/step / flowrl s/step: {s['speedup']:.2f}x median "
        f"(per ABBA pair: {', '.join(f'{v:.2f}' for v in s['speedup_per_repeat'])}), "
        f"{s['speedup_fastest_step']:.2f}x fastest step, {s['speedup_quiet']:.2f}x quiet turns "
        f"({s['flowrl']['num_quiet_blocks']} flowrl, {s['trl']['num_quiet_blocks']} trl); "
        f"flowrl/trl s/step {s['ratio_flowrl_over_trl_s_per_step']:.2f}, "
        f"tokens/s {s['tokens_per_s_ratio_flowrl_over_trl']:.2f}, CPU s/step {s['cpu_s_ratio_flowrl_over_trl']:.2f}",
    ]
    fl = s["flowrl"]["breakdown_median_s"]
    lines.append("flowrl median s: " + ", ".join(f"{k}={v:.3f}" for k, v in sorted(fl.items())))
    lines.append("trl median s: " + ", ".join(f"{k}={v:.3f}" for k, v in s["trl"]["breakdown_median_s"].items()))
    return "\n".join(lines)


PHASES = {"flowrl": ("timing_s/gen", "timing_s/update_actor", "timing_s/reshard"), "trl": ("generate_s",)}


def grid_report(scales: dict[str, Any]) -> str:
    """One line per cell: flowrl/TRL step time, each side's generation and the rest of its step,
    flowrl's update and weight sync, and both sides' padding ratios (decode, train)."""
    rows = []
    for name, result in scales.items():
        s = result["summary"]
        f, t = s["flowrl"]["breakdown_median_s"], s["trl"]["breakdown_median_s"]
        rows.append([
            name, s["flowrl"]["s_per_step"], s["trl"]["s_per_step"], s["ratio_flowrl_over_trl_s_per_step"],
            f.get("timing_s/gen", float("nan")), f.get("timing_s/update_actor", float("nan")),
            f.get("timing_s/reshard", float("nan")), t.get("generate_s", float("nan")),
            s["trl"]["s_per_step"] - t.get("generate_s", float("nan")),
            f"{f.get('perf/gen_padding_ratio', float('nan')):.2f}/{f.get('perf/train_padding_ratio', float('nan')):.2f}",
            f"{t.get('gen_padding_ratio', float('nan')):.2f}/{t.get('train_padding_ratio', float('nan')):.2f}",
        ])
    return table(["cell", "flowrl s", "trl s", "flowrl/trl", "fl gen", "fl update", "fl reshard", "trl gen",
                  "trl rest", "fl pad gen/train", "trl pad gen/train"], rows)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=[*SCALES, "both", "grid"], default="default",
                   help="a scale, both original scales, or 'grid': every cell of GRID (issue 14)")
    p.add_argument("--repeats", type=int, default=3, help="turns per framework (ABBA order)")
    p.add_argument("--steps", type=int, default=0, help="timed steps per turn (0: the scale's default)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per framework before the first turn")
    p.add_argument("--out", default="", help="default: benchmarks/results/vs_trl.json (vs_trl_grid.json with --scale grid)")
    p.add_argument("--workdir", default="", help="models, data, run dirs and child logs "
                   "(default: a temp dir, removed after a successful run)")
    p.add_argument("--flowrl-flags", nargs="*", default=[], metavar="KEY=VALUE",
                   help="flowrl keys added to its side (default none: flowrl at its defaults)")
    p.add_argument("--serve", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        (serve_flowrl if args.serve == "flowrl" else serve_trl)(json.loads(args.spec))
        return None
    args.out = args.out or f"benchmarks/results/vs_trl{'_grid' if args.scale == 'grid' else ''}.json"
    if args.repeats < 1:
        raise ValueError(f"--repeats={args.repeats} must be at least 1")

    import tempfile

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="flowrl_vs_trl_"))
    common = Common()
    names = {"both": ["default", "large"], "grid": list(GRID)}.get(args.scale, [args.scale])
    out: dict[str, Any] = {
        "benchmark": "vs_trl",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(),
        "versions": package_versions(
            ["flowrl", "trl", "torch", "transformers", "accelerate", "datasets", "dask", "distributed"]
        ),
        "common_settings": dataclasses.asdict(common),
        "trl_threads": TRL_THREADS,
        "notes": NOTES,
        "scales": {},
    }
    start = time.perf_counter()
    for name in names:
        scale = SCALES[name]
        k = args.steps or scale.steps_per_block
        result = bench_scale(
            name, scale, common, repeats=args.repeats, warmup=args.warmup, steps_per_block=k, workdir=workdir / name,
            flowrl_flags=tuple(args.flowrl_flags),
        )
        spec = {"scale": result["settings"], "common": dataclasses.asdict(common), "flowrl_flags": args.flowrl_flags,
                "model_dir": "<model_dir>", "train_path": "<train.parquet>", "run_dir": "<run_dir>"}
        result["trl_grpo_config"] = trl_settings(spec)
        result["flowrl_overrides"] = flowrl_overrides(spec)
        out["scales"][name] = result
        print("\n" + report(name, result) + "\n", flush=True)
    out["total_wall_s"] = time.perf_counter() - start
    if len(names) > 1:
        print(grid_report(out["scales"]), flush=True)
    out["machine"]["load_avg_at_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out} ({out['total_wall_s']:.0f}s)")
    if not args.workdir:  # kept on failure: the children's logs are there
        shutil.rmtree(workdir, ignore_errors=True)
    return out


if __name__ == "__main__":
    main()

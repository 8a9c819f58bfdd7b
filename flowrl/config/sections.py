"""The plain sections of the run configuration: prompt data, the model, the optimizer, the loop.

Part of the schema (see :mod:`flowrl.config.schema`); every field has a docstring that ``flowrl
config --fields`` prints.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from flowrl.config.checks import ChecksConfig
from flowrl.config.errors import check, check_one_of, check_positive
from flowrl.models.tiny import TINY_PRESETS
from flowrl.parallel.dtypes import COMPUTE_DTYPES, MODEL_DTYPES

TASK_PRESETS = tuple(TINY_PRESETS)
"""``model.tiny``: the tiny model presets the embedded default task can be built with."""

DTYPES = COMPUTE_DTYPES  # concrete dtypes (fsdp_config.mixed_precision); model.dtype takes MODEL_DTYPES
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")  # trainer.logger; sinks in flowrl/metrics/logger.py
LR_SCHEDULES = ("constant", "cosine", "linear")  # optim.lr_scheduler_type; flowrl/backends/train/optim.py


@dataclass(kw_only=True)
class DataConfig:
    train_files: str = ""
    """Parquet file(s) of prompts in verl's format (comma-separated). Empty: the embedded
    two-digit addition task, built on first use under ``trainer.cache_dir``."""
    val_files: str = ""
    """Parquet file(s) of validation prompts, used every ``trainer.test_freq`` steps. Empty with
    the embedded default task: its held-out test split."""
    val_max_samples: int = -1
    """Validate on the first this many prompts of ``val_files`` (-1: all)."""
    prompt_key: str = "prompt"
    """Column holding the chat messages (a list of {role, content}) or a plain string."""
    train_batch_size: int = 64
    """Prompts per step (each sampled ``rollout.n`` times)."""
    max_prompt_length: int = 32
    """Prompts longer than this many tokens are reported and left out (``filter_overlong_prompts``)
    or cut (``truncation``). 32 suits the embedded task; verl's default is 512."""
    filter_overlong_prompts: bool = True
    """Leave out (and report in ``rejected_prompts.jsonl``) prompts longer than
    ``max_prompt_length``; false: apply ``truncation`` to them (verl's default is false)."""
    truncation: Literal["error", "left", "right", "middle"] = "error"
    """An overlong prompt that is not filtered out: ``error`` (fail, naming the row), or keep its
    last (``left``), first (``right``) or first and last halves (``middle``) ``max_prompt_length``
    tokens, as verl."""
    shuffle: bool = True
    """Shuffle prompts each epoch (deterministically, from ``trainer.seed``)."""

    def __post_init__(self) -> None:
        check_positive("train_batch_size", self.train_batch_size, "use e.g. 32")
        check_positive("max_prompt_length", self.max_prompt_length, "use e.g. 512")
        check_one_of("truncation", self.truncation, ("error", "left", "right", "middle"))


@dataclass(kw_only=True)
class ModelConfig:
    path: str = ""
    """A local transformers model directory (Llama or Qwen2 family). Empty: the embedded tiny
    model of the default task."""
    tiny: str = "default"
    """With ``model.path`` empty: the embedded default task's model preset
    (``flowrl.models.tiny.TINY_PRESETS``): ``default`` (Qwen2, 0.13M parameters) or ``moe`` (a
    Qwen3-MoE of 4 experts, 2 per token, ~0.13M parameters; its task is built and cached apart,
    ``<trainer.cache_dir>/default_task_moe``)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The compute dtype of every engine: ``auto`` is bf16 on GPU ranks and fp32 on CPU ranks, as
    the device plan says (``flowrl devices``). On a GPU a trained engine keeps fp32 parameters
    (the optimizer's master weights) and computes in this dtype (dp: autocast; fsdp:
    ``MixedPrecisionPolicy``; megatron: ``bf16`` with fp32 main parameters and gradient
    reduction); frozen engines and generation hold their weights in it. On the CPU the
    parameters are held in it (``bfloat16``: bf16 parameters and optimizer state)."""
    enable_gradient_checkpointing: bool = False
    """Recompute each block's activations in backward (the policy; ``actor.strategy=fsdp``)."""
    lora_rank: int = 0
    """LoRA adapters of this rank on ``target_modules`` through peft (0: train every weight). Only
    the adapters (and ``modules_to_save``) train and sit in the optimizer; the reference policy is
    the same model with the adapters disabled (no reference group); the weight sync sends ``hf``
    the merged weights and vLLM the adapters only; checkpoints hold the adapters (``flowrl
    export-hf --merge-lora`` or ``--adapter-only``). ``actor.strategy`` ``fsdp`` or ``dp``. LoRA
    wants a larger ``actor.optim.lr`` (verl: about 10x; the default task: 2e-3 at rank 8) and, on
    real models, rank >= 32 (verl's advice)."""
    lora_alpha: int = 16
    """LoRA scaling numerator: the adapters' output is scaled by ``lora_alpha / lora_rank`` (16:
    verl's default). Adam's first update changes the weights in proportion to
    ``lora_alpha * actor.optim.lr``, whatever the rank: raise one, lower the other."""
    lora_adapter_path: str = ""
    """A saved peft LoRA adapter to continue training (verl's key): its rank, alpha, target modules
    and modules_to_save become ``model.*`` at start, the adapters start from its weights
    (:mod:`flowrl.models.lora_adapter`). Empty: fresh adapters when ``lora_rank`` > 0."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: ``all-linear`` (every linear layer but the output head, peft's)
    or module names (a list, or comma-separated: ``q_proj,v_proj``)."""
    exclude_modules: str = ""
    """With LoRA: a regular expression over full module names (``model.layers.0.self_attn.q_proj``);
    a module it matches whole gets no adapter even if ``target_modules`` names it (peft's
    ``exclude_modules``, verl's key: ``.*visual.*`` keeps a vision-language model's vision tower
    without adapters). Empty: none left out."""
    modules_to_save: str | list[str] = ""
    """With LoRA: modules trained whole next to the adapters, peft's ``modules_to_save`` (a list,
    or comma-separated; empty: none). ``embed_tokens`` trains the input embedding, and with tied
    embeddings the output head too (peft's ``ensure_weight_tying``); the reference keeps the
    originals, checkpoints and the optimizer hold the copies, the sync sends them with the
    adapters. The default task's model (tied, 99 tokens) learns like full-weight training with
    ``embed_tokens``, not without it."""

    def __post_init__(self) -> None:
        check_one_of("dtype", self.dtype, MODEL_DTYPES)
        check_one_of("tiny", self.tiny, TASK_PRESETS)
        check(isinstance(self.lora_rank, int) and self.lora_rank >= 0, "lora_rank", self.lora_rank,
              "must be an integer >= 0", "use 0 (no LoRA) or e.g. 8")
        check(isinstance(self.lora_alpha, int) and self.lora_alpha > 0, "lora_alpha", self.lora_alpha,
              "must be an integer > 0", "use e.g. 16 (or 2 * lora_rank)")
        check(not self.modules_to_save or self.lora_rank > 0, "modules_to_save", self.modules_to_save,
              "trains modules next to LoRA adapters", "set model.lora_rank > 0, or leave modules_to_save empty")
        check_exclude_modules(self)
        names_ok = (isinstance(self.target_modules, str) and bool(self.target_modules.strip(" ,"))) or (
            isinstance(self.target_modules, (list, tuple)) and bool(self.target_modules)
            and all(isinstance(t, str) and t for t in self.target_modules))
        check(names_ok, "target_modules", self.target_modules, "must be all-linear or non-empty module names",
              "use all-linear, or e.g. [q_proj,v_proj]")


def check_exclude_modules(model: ModelConfig) -> None:
    """``model.exclude_modules``: a string that compiles as a regular expression (read with LoRA only,
    as ``target_modules`` is)."""
    pattern = model.exclude_modules
    check(isinstance(pattern, str), "exclude_modules", pattern, "must be one regular expression",
          "use e.g. '.*visual.*' (a module's full name must match it whole)")
    if not pattern:
        return
    try:
        re.compile(pattern)
    except re.error as exc:
        check(False, "exclude_modules", pattern, f"is not a regular expression ({exc})", "use e.g. '.*visual.*'")


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 5e-4
    """AdamW learning rate (5e-4 suits the embedded tiny model; real models want ~1e-6)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas (verl's, TRL's and torch's default; ``benchmarks/learning_vs_trl.py`` and the
    default task chose it over 0.9/0.99)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    lr_scheduler_type: str = "constant"
    """Learning-rate schedule over the run's ``trainer.total_training_steps`` updates, stepped once
    per RL step as in verl: ``constant``, ``cosine`` (verl's, down to ``min_lr_ratio * lr``) or
    ``linear`` (transformers' linear decay to ``min_lr_ratio * lr``: TRL's default). verl's
    deprecated ``warmup_style`` is accepted as this key."""
    lr_warmup_steps: int = -1
    """Updates of linear warm-up from 0 to ``lr`` (verl's key); <= 0: ``lr_warmup_steps_ratio``."""
    lr_warmup_steps_ratio: float = 0.0
    """Warm-up as a fraction of ``trainer.total_training_steps`` (used when ``lr_warmup_steps`` <= 0)."""
    min_lr_ratio: float = 0.0
    """``cosine`` / ``linear``: the rate the schedule ends at, as a fraction of ``lr``."""
    num_cycles: float = 0.5
    """``cosine``: cosine periods over the decay (0.5: half a period, from ``lr`` down to the floor)."""

    def __post_init__(self) -> None:
        check_one_of("lr_scheduler_type", self.lr_scheduler_type, LR_SCHEDULES)
        check(0 <= self.lr_warmup_steps_ratio < 1, "lr_warmup_steps_ratio", self.lr_warmup_steps_ratio,
              "must be in [0, 1)", "use 0.0 (no warm-up) or e.g. 0.05")
        check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]",
              "use 0.0 (decay to 0) or e.g. 0.1")
        check(self.num_cycles > 0 and math.isfinite(self.num_cycles), "num_cycles", self.num_cycles,
              "must be a finite number > 0", "use 0.5 (half a cosine period)")
        check_positive("lr", self.lr, "use a learning rate such as 1e-6 (large models) .. 1e-3 (tiny)")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0", "use 0.0 or 0.01")
        check(
            all(0 <= b < 1 for b in self.betas), "betas", self.betas, "each must be in [0, 1)", "use (0.9, 0.999)"
        )
        check_positive("eps", self.eps, "use 1e-8")
        check(self.grad_clip >= 0, "grad_clip", self.grad_clip, "must be >= 0", "use 1.0, or 0 to disable")



@dataclass(kw_only=True)
class TrainerConfig:
    total_training_steps: int = 60
    """RL iterations to run; with ``total_epochs`` > 0 at most this many (0: no cap)."""
    total_epochs: int = 0
    """Passes over the training prompts (verl's ``trainer.total_epochs``): the run trains
    ``total_epochs * (usable prompts // data.train_batch_size)`` steps, capped by
    ``total_training_steps`` when > 0. 0: ``total_training_steps`` alone."""
    val_before_train: bool = False
    """Validate once before the first step (logged at step 0 with the first step's metrics,
    needs ``test_freq`` > 0 or ``data.val_files``); verl's default is true."""
    critic_warmup: int = 0
    """Steps that train only the critic before the actor starts (verl's key): for the first
    this many steps the PPO family updates the critic alone (no actor update, no weight sync).
    Needs a critic (``algorithm.adv_estimator=gae``)."""
    staleness: int = 0
    """Asynchronous RL: how many weight versions the rollout may lag behind the trainer. 0: on
    policy (each step generates with the weights of the step before). 1: verl's one-step
    off-policy, step k+1 generates with the weights of step k-1 while step k trains; N: the
    generations of the next N steps run ahead, N versions behind. Needs rollout and actor on their
    own devices (``rollout.free_cache_engine=false``); each sample carries ``weight_version``.
    A checkpoint drops the generations in flight: after a resume they are generated again, for
    the same prompts and seeds, with the checkpoint's weights. With ``async_mode=stream``: the
    oldest weight version a trained sample may come from (older ones are refused and generated
    again, ``async/stale_samples``)."""
    async_mode: str = "none"
    """``none``: generation per step (``staleness`` ahead); ``stream``: fully asynchronous, the
    rollout generates continuously into a bounded queue of experience tables (requests of
    ``stream_request_size`` prompts, as Dask futures) and each step trains on the next
    ``data.train_batch_size`` groups of it; a weight update reaches the rollout between requests
    (verl's fully async trainer). Needs the rollout on its own devices, as ``staleness``."""
    max_queue_size: int = 0
    """Stream mode: prompt groups generated or in generation that the trainer has not taken yet
    (the queue's bound, verl's ``max_queue_size``). 0: ``(staleness + 1) * data.train_batch_size``."""
    stream_request_size: int = 0
    """Stream mode: prompts per generation request (a divisor of ``data.train_batch_size``). 0:
    a quarter of ``data.train_batch_size`` (the whole batch when 4 does not divide it)."""
    partial_rollout: bool = False
    """Stream mode (verl's ``async_training.partial_rollout``): generate each request in pieces of
    ``partial_rollout_tokens`` tokens, so a weight update interrupts a request between pieces and
    the rest of its responses continues with the new weights (``weight_version`` is then the
    version of a row's first token, ``weight_version_max`` that of its last)."""
    partial_rollout_tokens: int = 4
    """Stream mode with ``partial_rollout``: tokens per generation piece."""
    project_name: str = "flowrl"
    """Project of the ``wandb`` logger (verl's ``trainer.project_name``)."""
    experiment_name: str = ""
    """Run name (verl's): of the ``wandb`` logger and of the default run directory
    ``runs/<project_name>/<experiment_name>``; empty: the run directory's name."""
    test_freq: int = 0
    """Validate on ``data.val_files`` every this many steps and after the last (0: never);
    metrics ``val-core/...``, samples in ``<run_dir>/validation/``."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    run_dir: str = ""
    """Run directory (verl's ``trainer.default_local_dir``). Empty: ``runs/<project_name>/
    <experiment_name>`` under the current directory, or without an experiment name
    ``runs/<project_name>/<adv_estimator>-<hash of the settings that shape the run>``, so the same
    command (even with more steps or other loggers) resumes there (``flowrl.run.run_dir``)."""
    cache_dir: str = ""
    """Where the embedded default task is built. Empty: ``~/.cache/flowrl``."""
    save_experience: bool = True
    """Write each step's experience table as ``experience/step_XXXXXX.parquet``."""
    progress: bool = True
    """Show a progress bar when stderr is a terminal (the per-step line is the ``console`` logger's)."""
    logger: list[str] = field(default_factory=lambda: ["console"])
    """Metric sinks, verl's ``trainer.logger``: any of ``console`` (one line per step),
    ``jsonl``, ``tensorboard`` (event files under ``<run_dir>/tensorboard``, needs the
    ``tensorboard`` package). ``metrics.jsonl`` is always written (the dashboard and resume read
    it), so ``jsonl`` is accepted but changes nothing. Override as ``trainer.logger=[console,tensorboard]``."""
    save_freq: int = 0
    """Save a checkpoint under ``<run_dir>/checkpoints`` every this many steps, and after the
    last step (0: never). With ``actor.strategy=megatron`` each rank writes its own chunks."""
    max_ckpt_to_keep: int = 3
    """Keep only this many newest checkpoints (0: keep all)."""
    resume_mode: str = "auto"
    """``auto``: resume from the newest complete checkpoint under ``<run_dir>/checkpoints`` if
    there is one, else start fresh; ``disable``: always start fresh; or a checkpoint directory."""
    max_restarts: int = 3
    """When a worker holding a rank dies mid-run, rebuild the worker groups and continue from the
    last checkpoint (steps since it run again), at most this many times per run (0: fail)."""
    save_on_signal: str = "USR1"
    """On this signal (``USR1`` or ``USR2``; empty: off) the run finishes the step in flight,
    saves a checkpoint and exits with status 0; running it again resumes there (SLURM
    preemption: ``#SBATCH --signal=B:USR1@90``, see the README)."""
    file_mode: str = "private"
    """Modes of everything the run writes (checkpoints, experience, metrics, config, logs):
    ``private`` files 0600 and folders 0700 (only you); ``group`` 0640 and 0750, for a team that
    shares run directories through a Unix group (``flowrl.data.file_modes``)."""
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    """The run's checks of itself, each ``off`` | ``warn`` | ``error`` (``trainer.checks.staleness=warn``):
    weight-version lag, NaN/inf rewards and advantages, learning signal, reward time, token-exact
    trajectories, rollout/trainer log-prob agreement (``flowrl.config.checks``, README "Checks")."""

    def __post_init__(self) -> None:
        check(self.total_training_steps > 0 or (self.total_training_steps == 0 and self.total_epochs > 0),
              "total_training_steps", self.total_training_steps, "must be > 0 (0 only with total_epochs > 0)",
              "use e.g. 40, or set trainer.total_epochs")
        check(self.total_epochs >= 0, "total_epochs", self.total_epochs, "must be >= 0", "use 0 or e.g. 15")
        check(self.critic_warmup >= 0, "critic_warmup", self.critic_warmup, "must be >= 0",
              "use 0 (the actor trains from the first step) or e.g. 5")
        check(self.staleness >= 0, "staleness", self.staleness, "must be >= 0",
              "use 0 (on policy) or 1 (one-step off-policy)")
        check_one_of("async_mode", self.async_mode, ("none", "stream"))
        check_one_of("file_mode", self.file_mode, ("private", "group"))
        check(self.max_queue_size >= 0, "max_queue_size", self.max_queue_size, "must be >= 0",
              "use 0 ((staleness + 1) * data.train_batch_size) or a multiple of stream_request_size")
        check(self.stream_request_size >= 0, "stream_request_size", self.stream_request_size, "must be >= 0",
              "use 0 (a quarter of data.train_batch_size) or a divisor of data.train_batch_size")
        check_positive("partial_rollout_tokens", self.partial_rollout_tokens, "use e.g. 4 (or 512 for long responses)")
        check(self.max_restarts >= 0, "max_restarts", self.max_restarts, "must be >= 0",
              "use 0 (fail on a lost worker) or e.g. 3")
        check(self.save_on_signal in ("", "USR1", "USR2"), "save_on_signal", self.save_on_signal,
              "is not a signal flowrl saves on", "use USR1, USR2 or an empty string (off)")
        check(self.save_freq >= 0, "save_freq", self.save_freq, "must be >= 0",
              "use 0 (never save) or e.g. 10 (every 10 steps)")
        check(self.max_ckpt_to_keep >= 0, "max_ckpt_to_keep", self.max_ckpt_to_keep, "must be >= 0",
              "use 0 (keep all) or e.g. 3")
        check(bool(self.resume_mode), "resume_mode", self.resume_mode, "must not be empty",
              "use auto, disable or the path of a checkpoint directory")
        for name in self.logger:
            check_one_of("logger", name, LOGGERS)
        check(len(set(self.logger)) == len(self.logger), "logger", self.logger, "names a logger twice",
              "list each logger once, e.g. [console,tensorboard]")

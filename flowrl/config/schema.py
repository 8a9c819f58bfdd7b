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

from flowrl.config.errors import check

GEN_BACKENDS = ("hf", "vllm")
TRAIN_STRATEGIES = ("dp", "megatron")
DTYPES = ("float32", "bfloat16")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


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
    """Parquet file(s) of validation prompts (optional)."""
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
class RolloutConfig(ParallelFields):
    name: Literal["hf", "vllm"] = "hf"
    """Generation backend: ``hf`` (transformers generate, CPU) or ``vllm`` (GPU)."""
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

    def __post_init__(self) -> None:
        self._check_mesh()
        _in("name", self.name, GEN_BACKENDS)
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
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """Registered advantage estimator (grpo, rloo, reinforce_plus_plus, gae)."""
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

    def __post_init__(self) -> None:
        check(0 <= self.gamma <= 1, "gamma", self.gamma, "must be in [0, 1]", "use 1.0")
        check(0 <= self.lam <= 1, "lam", self.lam, "must be in [0, 1]", "use 1.0")


@dataclass(kw_only=True)
class TrainerConfig:
    total_training_steps: int = 60
    """RL iterations to run."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    run_dir: str = ""
    """Run directory. Empty: ``runs/<UTC timestamp>`` under the current directory."""
    cache_dir: str = ""
    """Where the embedded default task is built. Empty: ``~/.cache/flowrl``."""
    save_experience: bool = True
    """Write each step's experience table as ``experience/step_XXXXXX.parquet``."""
    progress: bool = True
    """Show a progress bar and one console line per step."""
    save_freq: int = 0
    """Save a checkpoint under ``<run_dir>/checkpoints`` every this many steps, and after the
    last step (0: never). ``dp`` strategy only for now."""
    max_ckpt_to_keep: int = 3
    """Keep only this many newest checkpoints (0: keep all)."""
    resume_mode: str = "auto"
    """``auto``: resume from the newest complete checkpoint under ``<run_dir>/checkpoints`` if
    there is one, else start fresh; ``disable``: always start fresh; or a checkpoint directory."""

    def __post_init__(self) -> None:
        _positive("total_training_steps", self.total_training_steps, "use e.g. 40")
        check(self.save_freq >= 0, "save_freq", self.save_freq, "must be >= 0",
              "use 0 (never save) or e.g. 10 (every 10 steps)")
        check(self.max_ckpt_to_keep >= 0, "max_ckpt_to_keep", self.max_ckpt_to_keep, "must be >= 0",
              "use 0 (keep all) or e.g. 3")
        check(bool(self.resume_mode), "resume_mode", self.resume_mode, "must not be empty",
              "use auto, disable or the path of a checkpoint directory")


@dataclass(kw_only=True)
class ClusterConfig:
    scheduler_address: str = ""
    """Connect to this Dask scheduler (``tcp://host:port``). Empty: start a LocalCluster."""
    host: str = "127.0.0.1"
    """Address the LocalCluster's scheduler and workers bind to."""
    dashboard: bool = False
    """Serve the Dask dashboard (on ``host``, a free port)."""
    memory_limit: str = "4GiB"
    """Memory limit per LocalCluster worker process."""
    timeout_s: float = 600.0
    """Timeout of every wait on a worker group call or graph result."""
    low_latency: bool = True
    """Cap Dask's message-batching intervals at 0.5 ms in this process (the LocalCluster's
    scheduler lives here): about 5x less scheduling latency per graph node."""
    startup_timeout_s: float = 180.0
    """Timeout for starting the cluster and the worker groups."""

    def __post_init__(self) -> None:
        _positive("timeout_s", self.timeout_s, "use e.g. 600")
        _positive("startup_timeout_s", self.startup_timeout_s, "use e.g. 180")
        check(self.host != "", "host", self.host, "must not be empty", "use 127.0.0.1")


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
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and rewards."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The loop."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Where the workers run."""

    def __post_init__(self) -> None:
        # Imported here: registries pull torch, and config must stay light.
        from flowrl.algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES

        check(
            self.algorithm.adv_estimator in ADVANTAGE_ESTIMATORS,
            "algorithm.adv_estimator",
            self.algorithm.adv_estimator,
            "is not a registered advantage estimator",
            "use one of " + ", ".join(ADVANTAGE_ESTIMATORS.names()),
        )
        check(
            not ADVANTAGE_ESTIMATORS.get(self.algorithm.adv_estimator).needs_values,
            "algorithm.adv_estimator",
            self.algorithm.adv_estimator,
            "needs a critic, which this release does not train yet",
            "use grpo, rloo or reinforce_plus_plus",
        )
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
            not (self.actor.strategy == "megatron" and self.trainer.save_freq > 0),
            "trainer.save_freq",
            self.trainer.save_freq,
            "with actor.strategy=megatron: sharded megatron checkpoints are not wired yet",
            "use trainer.save_freq=0 (or actor.strategy=dp)",
        )
        if self.actor.strategy == "dp":
            check(
                self.actor.world_size == self.actor.data_parallel_size,
                "actor.strategy",
                self.actor.strategy,
                "is data parallel only",
                "use actor.strategy=megatron",
            )

    @property
    def num_optimizer_steps_per_batch(self) -> int:
        return self.actor.ppo_epochs * (self.data.train_batch_size // self.actor.ppo_mini_batch_size)

    @property
    def needs_old_logprobs(self) -> bool:
        """A separate old-log-prob pass is needed only when one batch feeds several optimizer
        steps; with one step the pre-update policy is the current one and the update uses its own
        detached log-probs (ratio exactly 1), which saves a forward pass."""
        return self.num_optimizer_steps_per_batch > 1

    @property
    def needs_reference(self) -> bool:
        return self.actor.use_kl_loss

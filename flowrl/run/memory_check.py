"""Pre-flight: each trainer rank's GPU memory against its GPU, before any worker starts.

On a device plan with GPUs, the actor's layout as the config names it (:func:`trainer_layout`)
goes through ``flowrl parallel-plan``'s memory model (``flowrl.parallel.rank_memory``); a layout
that cannot fit is a :class:`~flowrl.config.ConfigError` naming what was computed and the keys
that lower it. On the CPU (no GPU in the plan) nothing is checked. The GPU's memory:
``cluster.gpu_memory_gb``, else ``nvidia-smi``'s on a local cluster, else unknown (no check).

Roles that share a GPU are summed (:func:`check_shared_gpus`): while the actor updates, a critic
on the same GPU keeps its weights, optimizer state (and a megatron's gradient buffers) there
unless offloaded, and the other way round; in the hybrid placement with vLLM, the engine's pool
(``rollout.gpu_memory_utilization`` of the GPU) sits beside whatever the trainers keep during
generation, and beside their update too when the engine does not sleep
(``rollout.free_cache_engine``): ``flowrl parallel-plan --for hybrid``'s phases
(``flowrl.parallel.hybrid_memory``).
"""

from __future__ import annotations

import subprocess
from typing import Any, Callable

from flowrl.catalog.backends import GEN_BACKENDS
from flowrl.config import ConfigError
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.layout_cost import RESERVED_GB
from flowrl.parallel.rank_memory import Capabilities, TrainerLayout, TrainerMemory, estimate, memory_problem

__all__ = ["check_shared_gpus", "check_trainer_memory", "critic_layout", "gpu_memory_gb", "host_bytes_per_param", "offloaded_bytes", "trainer_capabilities", "trainer_layout"]

NVIDIA_SMI_TIMEOUT_S = 20.0
FSDP_PARAM_HOST_BYTES = 8
"""Host bytes per parameter (of a rank's 1/dp shard) with FSDP's ``param_offload``: the fp32
sharded parameter and its fp32 gradient (``Module.to`` moves ``.grad`` too;
``flowrl.backends.train.fsdp_offload.move_modules``)."""
FSDP_OPTIMIZER_HOST_BYTES = 8
"""With ``optimizer_offload``: AdamW's two fp32 moments (``exp_avg``, ``exp_avg_sq``)."""
_QUERY = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]


def _run(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True).stdout


def gpu_memory_gb(cfg: Any, runner: Callable[[list[str]], str] | None = None) -> float:
    """One GPU's memory in GB: ``cluster.gpu_memory_gb`` when set; on a local cluster the smallest
    ``memory.total`` (MiB) ``nvidia-smi`` lists; else 0 (unknown)."""
    if cfg.cluster.gpu_memory_gb > 0:
        return float(cfg.cluster.gpu_memory_gb)
    if cfg.cluster.kind != "local":
        return 0.0
    try:
        out = (runner or _run)(_QUERY)
    except (OSError, subprocess.SubprocessError):
        return 0.0
    sizes = [float(line) for line in out.split() if line.replace(".", "", 1).isdigit()]
    return min(sizes) * 2**20 / 1e9 if sizes else 0.0


def _trainer_group(plan: Any) -> str | None:
    from flowrl.config.pools import HYBRID_GROUP

    names = {r.group for r in plan.ranks}
    return "actor" if "actor" in names else HYBRID_GROUP if HYBRID_GROUP in names else None


def _reference_offload(cfg: Any) -> str | None:
    """The key that keeps the reference's weights off the GPU outside its forward on
    ``actor.strategy``: ``fsdp_config.param_offload`` (FSDP2's CPUOffloadPolicy for a frozen
    engine) on a fully sharded backend, ``megatron.param_offload`` on one owning that section."""
    from flowrl.catalog.backends import TRAIN_BACKENDS
    from flowrl.config.megatron import MEGATRON_SECTION

    spec = TRAIN_BACKENDS.spec(cfg.actor.strategy)
    if spec.fully_sharded:
        return "ref.fsdp_config.param_offload"
    return "ref.megatron.param_offload" if spec.owns(MEGATRON_SECTION) else None


def _reference_shares(cfg: Any, plan: Any, group: str) -> bool:
    """A reference rank sits on a GPU of the trainer's (the hybrid group holds one in each rank)
    and keeps its weights there."""
    key = _reference_offload(cfg)
    if "ref" not in cfg.worker_group_sizes or (key and _value(cfg, key)):
        return False
    mine = {(r.node, g) for r in plan.group(group) for g in r.gpus}
    return group != "actor" or any((r.node, g) in mine for r in plan.group("ref") for g in r.gpus)


def _value(cfg: Any, key: str) -> Any:
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def trainer_layout(cfg: Any, plan: Any) -> TrainerLayout | None:
    """What the memory model reads of the actor's config on ``plan`` (None: no trainer on a GPU)."""
    from flowrl.catalog.backends import TRAIN_BACKENDS
    from flowrl.config.batching_auto import resolved_section

    group = _trainer_group(plan)
    if group is None or not any(r.gpus for r in plan.group(group)):
        return None
    a = resolved_section(cfg, "actor")
    spec = TRAIN_BACKENDS.spec(a.strategy)
    seq_len = cfg.data.max_prompt_length + cfg.rollout.response_length
    if a.use_dynamic_bsz:
        micro, key = max(1, a.ppo_max_token_len_per_gpu // seq_len), "ppo_max_token_len_per_gpu"
    else:
        micro, key = a.ppo_micro_batch_size_per_gpu, "ppo_micro_batch_size_per_gpu"
    fsdp = getattr(a, "fsdp_config", None)
    return TrainerLayout(
        section="actor", dims=ParallelDims(dp=a.data_parallel_size, tp=a.tensor_model_parallel_size,
                                           pp=a.pipeline_model_parallel_size),
        seq_len=seq_len, micro_batch_size=micro, micro_batch_key=key, micro_batch_value=getattr(a, key),
        global_batch_tokens=a.ppo_mini_batch_size * cfg.rollout.n * seq_len, dtype=plan.group(group)[0].dtype,
        fully_sharded=spec.fully_sharded, distributed_optimizer=spec.owns("use_distributed_optimizer")
        and a.use_distributed_optimizer and not spec.fully_sharded,
        state_on_host=spec.fully_sharded and bool(fsdp and fsdp.offload_policy),
        reference=_reference_shares(cfg, plan, group) and not cfg.model.lora_rank,
        recompute=bool(cfg.model.enable_gradient_checkpointing and spec.model_kwargs), lora_rank=cfg.model.lora_rank,
    )


def trainer_capabilities(cfg: Any) -> Capabilities:
    """What the actor's backend spec can change (``flowrl.parallel.rank_memory.memory_fixes``)."""
    from flowrl.catalog.backends import TRAIN_BACKENDS, ParallelAxis

    spec = TRAIN_BACKENDS.spec(cfg.actor.strategy)
    sharded = TRAIN_BACKENDS.names_where(lambda s: s.fully_sharded)
    return Capabilities(tensor_parallel=spec.supports(ParallelAxis.TP),
                        distributed_optimizer=spec.owns("use_distributed_optimizer"),
                        checkpointing=spec.model_kwargs is not None,
                        sharded_strategy=sharded[0] if sharded and not spec.fully_sharded else None,
                        reference_offload=_reference_offload(cfg))


def critic_layout(cfg: Any, plan: Any) -> tuple[TrainerLayout, Capabilities] | None:
    """The critic's layout and what its value backend can change (None: no critic on a GPU). Its
    model is the policy's shape with a one-output head (``value_head``); no reference, no
    gradient checkpointing (``model.*`` is the policy's)."""
    from flowrl.catalog.backends import VALUE_BACKENDS, ParallelAxis
    from flowrl.config.batching_auto import resolved_section

    if "critic" not in cfg.worker_group_sizes or not any(r.gpus for r in plan.group("critic")):
        return None
    c = resolved_section(cfg, "critic")
    spec = VALUE_BACKENDS.spec(c.strategy)
    seq_len = cfg.data.max_prompt_length + cfg.rollout.response_length
    key = "ppo_max_token_len_per_gpu" if c.use_dynamic_bsz else "ppo_micro_batch_size_per_gpu"
    micro = max(1, c.ppo_max_token_len_per_gpu // seq_len) if c.use_dynamic_bsz else c.ppo_micro_batch_size_per_gpu
    layout = TrainerLayout(
        section="critic", dims=ParallelDims(dp=c.data_parallel_size, tp=c.tensor_model_parallel_size,
                                            pp=c.pipeline_model_parallel_size),
        seq_len=seq_len, micro_batch_size=micro, micro_batch_key=key, micro_batch_value=getattr(c, key),
        global_batch_tokens=c.ppo_mini_batch_size * cfg.rollout.n * seq_len, dtype=plan.group("critic")[0].dtype,
        fully_sharded=spec.fully_sharded, state_on_host=spec.fully_sharded and c.fsdp_config.offload_policy,
        value_head=True)
    sharded = VALUE_BACKENDS.names_where(lambda s: s.fully_sharded)
    return layout, Capabilities(tensor_parallel=spec.supports(ParallelAxis.TP),
                                sharded_strategy=sharded[0] if sharded and not spec.fully_sharded else None)


def _model_spec(path: str) -> Any:
    from flowrl.parallel.model_spec import ModelSpec

    try:
        return ModelSpec.from_hf_config(path)
    except (ValueError, OSError):
        return None  # not a decoder config this model reads: the backends' own checks speak for it


def check_trainer_memory(cfg: Any, plan: Any, *, memory_gb: float | None = None,
                         runner: Callable[[list[str]], str] | None = None) -> dict[str, TrainerMemory]:
    """The estimate of an actor rank and a critic rank on ``plan``, by section (empty: the CPU,
    or the GPU's memory unknown); raises ConfigError when one cannot fit a GPU of ``memory_gb``
    (default :func:`gpu_memory_gb`), the actor's checked first."""
    if not plan.inventory.has_gpus or not cfg.model.path:
        return {}
    memory_gb = gpu_memory_gb(cfg, runner) if memory_gb is None else memory_gb
    if memory_gb <= 0:
        return {}
    actor = trainer_layout(cfg, plan)
    checks = [(actor, trainer_capabilities(cfg), cfg.model.path)] if actor is not None else []
    critic = critic_layout(cfg, plan)
    if critic is not None:
        checks.append((*critic, cfg.critic.model_path or cfg.model.path))
    out = {}
    for layout, can, path in checks:
        spec = _model_spec(path)
        if spec is None:
            continue
        problem = memory_problem(spec, layout, memory_gb, can)
        if problem is not None:
            raise ConfigError(f"{layout.section}.{layout.micro_batch_key}", layout.micro_batch_value, problem,
                              "change one of the keys above (flowrl devices shows the estimate)")
        out[layout.section] = estimate(spec, layout, memory_gb)
    check_shared_gpus(cfg, plan, out, memory_gb)
    return out


def _gpu_set(plan: Any, group: str) -> set[tuple[int, int]]:
    return {(r.node, g) for r in plan.group(group) for g in r.gpus} if group in {r.group for r in plan.ranks} else set()


def _offload_keys(cfg: Any, section: str) -> tuple[str | None, str | None]:
    """The keys that move ``section``'s parameters and its optimizer state to the host between
    phases on its strategy (None: the strategy has none)."""
    from flowrl.catalog.backends import TRAIN_BACKENDS, VALUE_BACKENDS
    from flowrl.config.megatron import MEGATRON_SECTION

    role = getattr(cfg, section)
    spec = (TRAIN_BACKENDS if section == "actor" else VALUE_BACKENDS).spec(role.strategy)
    if spec.fully_sharded and hasattr(role, "fsdp_config"):
        return f"{section}.fsdp_config.param_offload", f"{section}.fsdp_config.optimizer_offload"
    if spec.owns(MEGATRON_SECTION) and hasattr(getattr(role, "megatron", None), "param_offload"):
        return f"{section}.megatron.param_offload", f"{section}.megatron.optimizer_offload"
    return None, None


def _resident_gb(cfg: Any, section: str, est: TrainerMemory) -> tuple[float, list[str]]:
    """GB ``section``'s rank keeps on its GPU outside its own phases, and the keys that would
    move it off: its weights (and megatron's persistent fp32 gradient buffers; FSDP frees its
    gradients after each step) unless ``param_offload``, its optimizer state unless
    ``optimizer_offload``, a colocated reference's weights (counted in its ``reference`` part)."""
    from flowrl.catalog.backends import TRAIN_BACKENDS, VALUE_BACKENDS

    role = getattr(cfg, section)
    spec = (TRAIN_BACKENDS if section == "actor" else VALUE_BACKENDS).spec(role.strategy)
    fsdp = getattr(role, "fsdp_config", None)
    if spec.fully_sharded and fsdp is not None and fsdp.offload_policy:
        return est.parts_gb["reference"], []  # the sharded state lives on the host
    params_key, optim_key = _offload_keys(cfg, section)
    p, fixes = est.parts_gb, []
    gb = p["reference"]
    if params_key is None or not _value(cfg, params_key):
        gb += p["weights"] + (0.0 if spec.fully_sharded else p["grads"])
        fixes += [f"{params_key}=true"] if params_key else []
    if optim_key is None or not _value(cfg, optim_key):
        gb += p["optimizer"]
        fixes += [f"{optim_key}=true"] if optim_key else []
    return gb, fixes


def _engine_sleeps(cfg: Any) -> bool:
    value = cfg.rollout.free_cache_engine
    return value is True or value == "auto"  # auto sleeps where the engine shares the trainer's GPU


def check_shared_gpus(cfg: Any, plan: Any, estimates: dict[str, TrainerMemory], memory_gb: float) -> dict[str, float]:
    """The peaks of roles sharing GPUs, by phase (``actor``, ``critic``, ``rollout`` with a
    hybrid vLLM engine), in GB; raises ConfigError naming the phase, the sum and the keys that
    lower it when one exceeds what a GPU holds. Roles on disjoint GPUs add nothing."""
    from flowrl.config.pools import HYBRID_GROUP

    group = _trainer_group(plan)
    actor, critic = estimates.get("actor"), estimates.get("critic")
    if group is None or actor is None:
        return {}
    limit = actor.limit_gb
    shared_critic = critic is not None and bool(_gpu_set(plan, group) & _gpu_set(plan, "critic"))
    # an engine of its own that joins the trainer's group (vLLM) keeps its pool beside the trainer's state
    hybrid_vllm = group == HYBRID_GROUP and GEN_BACKENDS.spec(cfg.rollout.name).joins_trainer_group
    if not (shared_critic or hybrid_vllm):
        return {}
    actor_keep, actor_fixes = _resident_gb(cfg, "actor", actor)
    critic_keep, critic_fixes = _resident_gb(cfg, "critic", critic) if shared_critic else (0.0, [])
    pool = cfg.rollout.gpu_memory_utilization * memory_gb if hybrid_vllm else 0.0
    awake = 0.0 if _engine_sleeps(cfg) else pool
    engine_fixes = (["rollout.free_cache_engine=true"] if awake else [])
    phases: dict[str, tuple[float, str, list[str]]] = {
        "actor": (actor.total_gb + critic_keep + awake,
                  f"the actor's update {actor.total_gb:.1f} GB"
                  + (f" + the critic's resident state {critic_keep:.1f}" if shared_critic else "")
                  + (f" + vLLM's pool {awake:.1f} (it does not sleep)" if awake else ""),
                  critic_fixes + engine_fixes),
    }
    if shared_critic:
        phases["critic"] = (critic.total_gb + actor_keep + awake,
                            f"the critic's update {critic.total_gb:.1f} GB + the actor's resident state {actor_keep:.1f}"
                            + (f" + vLLM's pool {awake:.1f} (it does not sleep)" if awake else ""),
                            actor_fixes + engine_fixes)
    if hybrid_vllm:
        phases["rollout"] = (pool + actor_keep + critic_keep + RESERVED_GB,
                             f"vLLM's pool {pool:.1f} GB (rollout.gpu_memory_utilization="
                             f"{cfg.rollout.gpu_memory_utilization:g} of {memory_gb:g}) + the actor's resident state "
                             f"{actor_keep:.1f}" + (f" + the critic's {critic_keep:.1f}" if shared_critic else "")
                             + f" + reserved {RESERVED_GB:g}",
                             actor_fixes + critic_fixes + ["a lower rollout.gpu_memory_utilization"])
    for phase, (total, what, fixes) in phases.items():
        if total > limit:
            key = fixes[0].split("=")[0] if fixes and "=" in fixes[0] else "rollout.gpu_memory_utilization"
            raise ConfigError(
                key, _value(cfg, key),
                f"roles share each GPU: during the {phase} phase a GPU holds about {total:.1f} GB ({what}) and holds "
                f"{limit:.1f} (flowrl parallel-plan's memory model)",
                "set " + ", or ".join([*fixes, "cluster.placement=split (disjoint GPUs)"]))
    return {phase: total for phase, (total, _, _) in phases.items()}


def offloaded_bytes(cfg: Any, num_params: int | None = None) -> int:
    """Host bytes one actor rank keeps after loading when its engine offloads (what
    ``cluster.memory_limit=auto`` adds to the load, ``flowrl.cluster.host_memory``): its share of
    ``num_params`` (default: from ``model.path``'s config.json; 0 when it cannot be read) times
    :func:`host_bytes_per_param`."""
    per_param = host_bytes_per_param(cfg)
    if not per_param:
        return 0
    if num_params is None:
        from flowrl.parallel.model_spec import ModelSpec

        try:
            num_params = ModelSpec.from_hf_config(cfg.model.path).num_params if cfg.model.path else 0
        except (ValueError, OSError):
            num_params = 0
    return int(per_param * num_params)


def host_bytes_per_param(cfg: Any) -> float:
    """Offloaded host bytes of one actor rank per parameter of the model. A fully sharded backend
    (FSDP, its 1/dp shard): :data:`FSDP_PARAM_HOST_BYTES` with ``fsdp_config.param_offload`` +
    :data:`FSDP_OPTIMIZER_HOST_BYTES` with ``optimizer_offload`` (both with ``offload_policy``). A
    backend owning the ``megatron`` section (its 1/(tp x pp) shard): the parameter buffer with
    ``megatron.param_offload`` (2 bytes in bf16, 4 in fp32; gradients are dropped, not kept) + with
    ``optimizer_offload`` the fp32 main parameters and Adam's two moments (12 bytes; 8 in fp32,
    where the main parameters are the buffer), over dp too with the distributed optimizer."""
    from flowrl.catalog.backends import TRAIN_BACKENDS
    from flowrl.config.megatron import MEGATRON_SECTION

    a = cfg.actor
    spec = TRAIN_BACKENDS.spec(a.strategy)
    if spec.fully_sharded:
        f = a.fsdp_config
        return (FSDP_PARAM_HOST_BYTES * (f.param_offload or f.offload_policy)
                + FSDP_OPTIMIZER_HOST_BYTES * (f.optimizer_offload or f.offload_policy)) / a.data_parallel_size
    if not spec.owns(MEGATRON_SECTION):
        return 0.0
    m, fp32 = a.megatron, cfg.model.dtype == "float32"
    optimizer = (8 if fp32 else 12) / (a.data_parallel_size if a.use_distributed_optimizer else 1)
    shard = a.tensor_model_parallel_size * a.pipeline_model_parallel_size
    return ((4 if fp32 else 2) * m.param_offload + optimizer * m.optimizer_offload) / shard

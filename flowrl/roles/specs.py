"""The worker groups of a run, as :class:`~flowrl.actors.session.GroupSpec` objects built from a
``RunConfig``: which role each rank holds, with which keyword arguments, on which mesh.

Backend-specific keyword arguments come from the backends' specs (``engine_kwargs``,
``role_kwargs`` in :mod:`flowrl.catalog.backends`), so nothing here names a backend. Importing
this module imports no torch.
"""

from __future__ import annotations

from typing import Any

from flowrl.actors import GroupMesh
from flowrl.actors.session import GroupSpec
from flowrl.backends.interfaces import SamplingParams
from flowrl.catalog.backends import GEN_BACKENDS, TRAIN_BACKENDS
from flowrl.config.batching_auto import resolved_section
from flowrl.registry import import_string

__all__ = ["actor_spec", "critic_spec", "hybrid_specs", "lora_engine_kwargs", "needs_ref_group", "ref_spec", "reference_call", "rm_spec",
           "rollout_role_kwargs", "rollout_sampling", "rollout_spec"]


def _mesh(group_cfg: Any) -> GroupMesh:
    return GroupMesh(dp=group_cfg.data_parallel_size, tp=group_cfg.tensor_model_parallel_size,
                     pp=group_cfg.pipeline_model_parallel_size)


def _train_engine_kwargs(group_cfg: Any, strategy: str, actor: Any = None) -> dict:
    """The train backend ``strategy``'s extra engine arguments for ``group_cfg`` (its mesh; Ulysses,
    an unset size following ``actor``'s)."""
    from flowrl.backends.train.ulysses_options import sequence_parallel_kwargs

    fn = TRAIN_BACKENDS.spec(strategy).engine_kwargs
    return {**(import_string(fn)(group_cfg) if fn else {}), **sequence_parallel_kwargs(group_cfg, actor)}


def _model_engine_kwargs(model_cfg: Any, strategy: str) -> dict:
    """The policy's engine arguments from ``model.*`` (the backend's optional ``model_kwargs``)."""
    fn = TRAIN_BACKENDS.spec(strategy).model_kwargs
    return import_string(fn)(model_cfg) if fn else {}


def lora_engine_kwargs(model_cfg: Any) -> dict:
    """``{"lora": LoraSpec.to_dict()}`` with ``model.lora_rank`` > 0 (the backends that build LoRA
    take it, pre-flight refuses the others), else nothing."""
    if not model_cfg.lora_rank:
        return {}
    from flowrl.models.lora import LoraSpec

    return {"lora": LoraSpec.from_config(model_cfg).to_dict()}


def needs_ref_group(cfg: Any) -> bool:
    """Whether the run starts a reference worker group: it needs reference log-probs and the
    reference is not the actor's base model (LoRA: adapters disabled, :func:`reference_call`)."""
    return cfg.needs_reference and not cfg.model.lora_rank


def reference_call(cfg: Any) -> tuple[str, str]:
    """(group, method) computing the reference log-probs: the ``ref`` group's ``compute_logprobs``,
    or with LoRA the actor's ``compute_ref_logprobs`` (its base model, adapters disabled)."""
    return ("actor", "compute_ref_logprobs") if cfg.model.lora_rank else ("ref", "compute_logprobs")


def rollout_sampling(cfg: Any) -> SamplingParams:
    """How the rollout group samples during training (``rollout.*``)."""
    return SamplingParams.from_section(cfg.rollout, max_new_tokens=cfg.rollout.response_length)


def rollout_role_kwargs(rollout: Any, *, max_prompt_length: int, seed: int) -> dict:
    """``RolloutRole``'s backend-specific keyword arguments for a ``RolloutConfig`` (the
    backend spec's ``role_kwargs``; none for ``hf``)."""
    fn = GEN_BACKENDS.spec(rollout.name).role_kwargs
    return import_string(fn)(rollout, max_prompt_length=max_prompt_length, seed=seed) if fn else {}


def rollout_spec(cfg: Any) -> GroupSpec:
    """The generation group: ``RolloutRole`` with the backend ``rollout.name``."""
    from flowrl.config.free_cache_auto import with_free_cache_resolved

    r = with_free_cache_resolved(cfg)  # rollout.free_cache_engine=auto resolved for the engine
    extra = rollout_role_kwargs(r, max_prompt_length=cfg.data.max_prompt_length, seed=cfg.trainer.seed)
    return GroupSpec(
        "rollout", "flowrl.roles.rollout:RolloutRole",
        {"model_dir": cfg.model.path, "backend": r.name, "dtype": cfg.model.dtype,
         "micro_batch_size": r.micro_batch_size, "sampling": rollout_sampling(cfg), **extra,
         **({"multi_turn": r.multi_turn} if r.multi_turn.enable else {}), **lora_engine_kwargs(cfg.model)},
        _mesh(r),
    )


def actor_spec(cfg: Any) -> GroupSpec:
    """The trained policy: ``PolicyRole`` with the backend ``actor.strategy``."""
    r, a = cfg.rollout, resolved_section(cfg, "actor")  # batching auto resolved (flowrl.config.batching_auto)
    return GroupSpec(
        "actor", "flowrl.roles.policy:PolicyRole",
        {"model_dir": cfg.model.path, "actor": a, "dtype": cfg.model.dtype, "temperature": r.logprob_temperature,
         "response_length": r.response_length, "use_old_logprobs": cfg.needs_old_logprobs,
         **_bypass_kwargs(cfg),
         "seed": cfg.trainer.seed, "ref_micro_batch_size": cfg.ref.log_prob_micro_batch_size_per_gpu,
         "total_steps": cfg.trainer.total_training_steps,
         "engine_kwargs": {**_train_engine_kwargs(a, a.strategy), **_model_engine_kwargs(cfg.model, a.strategy),
                           **lora_engine_kwargs(cfg.model)}},
        _mesh(a),
    )


def _bypass_kwargs(cfg: Any) -> dict:
    """The rollout correction's bypass mode: its policy-loss settings for the actor (none outside it)."""
    from flowrl.config.rollout_bypass import bypass_settings

    settings = bypass_settings(cfg.algorithm)
    return {"bypass": settings} if settings is not None else {}


def ref_spec(cfg: Any) -> GroupSpec:
    """The frozen reference policy: ``ReferenceRole`` on the actor's backend, with ``ref``'s mesh."""
    strategy, ref = cfg.actor.strategy, resolved_section(cfg, "ref")
    return GroupSpec(
        "ref", "flowrl.roles.reference:ReferenceRole",
        {"model_dir": cfg.model.path, "strategy": strategy, "dtype": cfg.model.dtype,
         "temperature": cfg.rollout.logprob_temperature, "micro_batch_size": cfg.ref.log_prob_micro_batch_size_per_gpu,
         "max_token_len": ref.log_prob_max_token_len_per_gpu if ref.log_prob_use_dynamic_bsz else 0,
         "prefix_grouper": ref.use_prefix_grouper,
         "engine_kwargs": _train_engine_kwargs(cfg.ref, strategy, cfg.actor)},
        _mesh(cfg.ref),
    )


def critic_spec(cfg: Any) -> GroupSpec:
    """The PPO critic: ``CriticRole`` (its backend ``critic.strategy`` chosen inside the role)."""
    c = resolved_section(cfg, "critic")
    return GroupSpec(
        "critic", "flowrl.roles.critic:CriticRole",
        {"model_dir": c.model_path or cfg.model.path, "critic": c, "dtype": cfg.model.dtype,
         "response_length": cfg.rollout.response_length, "seed": cfg.trainer.seed,
         "total_steps": cfg.trainer.total_training_steps},
        _mesh(c),
    )


def rm_spec(cfg: Any) -> GroupSpec:
    """The neural reward model: ``RewardModelRole``, data parallel only."""
    rm = cfg.reward_model
    return GroupSpec(
        "rm", "flowrl.roles.reward_model:RewardModelRole",
        {"model_dir": rm.model_path, "dtype": cfg.model.dtype, "micro_batch_size": rm.micro_batch_size_per_gpu},
        GroupMesh(dp=rm.data_parallel_size, tp=1, pp=1),
    )


def hybrid_specs(specs: list[GroupSpec], *, num_threads: int = 1) -> tuple[list[GroupSpec], dict[str, tuple[str, GroupMesh]]]:
    """``cluster.placement=hybrid``: the rollout, actor and ref specs of ``specs`` fused into one
    group (``actor_rollout_ref``, ``flowrl.roles.hybrid:HybridRole``, one process per rank holding
    the three roles, each phase with ``num_threads`` threads), the others unchanged. Returns the
    specs to start and the views to add: group name -> (part of the hybrid role, its mesh), so
    the run's ``groups["rollout"]`` calls the rollout part of the same ranks. Without both an
    actor and a rollout spec, nothing is fused."""
    from flowrl.config.pools import HYBRID_GROUP, HYBRID_GROUPS

    fused = {s.name: s for s in specs if s.name in HYBRID_GROUPS}
    if not {"actor", "rollout"} <= set(fused):
        return list(specs), {}
    mesh = fused["actor"].mesh
    spec = GroupSpec(HYBRID_GROUP, "flowrl.roles.hybrid:HybridRole",
                     {"parts": {name: (s.role_cls, s.role_kwargs) for name, s in fused.items()}, "num_threads": num_threads},
                     mesh, fused["actor"].backend)
    return [spec] + [s for s in specs if s.name not in fused], {name: (name, s.mesh) for name, s in fused.items()}

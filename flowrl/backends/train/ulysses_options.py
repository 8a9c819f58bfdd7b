"""Ulysses sequence parallelism's light functions (torch-free): which strategies build it, the
engine keyword argument of a group's ``ulysses_sequence_parallel_size``, and its config check.

The engines are ``flowrl.backends.train.ulysses``'s; the split arithmetic is
``flowrl.data.sequence_split``'s.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SEQUENCE_PARALLEL_STRATEGIES", "check_model", "check_sequence_parallel", "group_size", "sequence_parallel_kwargs"]

SEQUENCE_PARALLEL_STRATEGIES = ("dp", "fsdp")
"""The strategies whose engines split sequences (``TorchDPEngine`` and its FSDP2 subclass, policy
and value). megatron's context parallelism is refused: see :func:`check_sequence_parallel`."""

MEGATRON_CP_REASON = (
    "megatron-core 0.16's context parallelism runs only inside Transformer Engine's attention "
    "(DotProductAttention with cp_comm_type; its local attention asserts context_parallel_size == 1), "
    "and Transformer Engine is not installed"
)


def group_size(group_cfg: Any, actor: Any = None) -> int:
    """A group's ``ulysses_sequence_parallel_size``; the reference's unset one (None) is ``actor``'s
    (verl's ``${oc.select:actor_rollout_ref.actor.ulysses_sequence_parallel_size,1}``)."""
    size = group_cfg.ulysses_sequence_parallel_size
    if size is None:
        return actor.ulysses_sequence_parallel_size if actor is not None else 1
    return size


def sequence_parallel_kwargs(group_cfg: Any, actor: Any = None) -> dict:
    """The engine's ``ulysses_sequence_parallel_size`` when > 1 (a group's section: actor, ref or
    critic; :func:`group_size`); nothing at 1, so engines without it are never given it."""
    size = group_size(group_cfg, actor)
    return {"ulysses_sequence_parallel_size": size} if size > 1 else {}


def check_sequence_parallel(section: str, size: Any, strategy: str, data_parallel_size: int) -> tuple[str, str] | None:
    """``(problem, fix)`` for a group's ``ulysses_sequence_parallel_size``, or None: it is fine."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return "must be an integer >= 1", f"set {section}.ulysses_sequence_parallel_size=1 (off) or e.g. 2"
    if size == 1:
        return None
    if strategy not in SEQUENCE_PARALLEL_STRATEGIES:
        return (f"Ulysses sequence parallelism runs in the {' and '.join(SEQUENCE_PARALLEL_STRATEGIES)} strategies, "
                f"not {strategy} (megatron's context_parallel_size is not built either: {MEGATRON_CP_REASON})",
                f"set the strategy to fsdp or dp, or {section}.ulysses_sequence_parallel_size=1")
    if data_parallel_size % size:
        return (f"must divide {section}.data_parallel_size={data_parallel_size} (groups of that many ranks split "
                "each sequence; verl: dp = world / sp)",
                f"set {section}.data_parallel_size to a multiple of {size}")
    return None


def check_model(cfg: Any, *, model_path: str) -> None:
    """Pre-flight, against the model's config: each group with ``ulysses_sequence_parallel_size``
    > 1 needs attention heads it divides and no sliding-window layers (the critic its own
    ``critic.model_path``). Raises :class:`~flowrl.config.ConfigError`."""
    from flowrl.config import ConfigError

    groups = [("actor", cfg.actor, model_path)]
    if cfg.needs_reference:
        groups.append(("ref", cfg.ref, model_path))
    if cfg.needs_critic:
        groups.append(("critic", cfg.critic, cfg.critic.model_path or model_path))
    for section, group, path in groups:
        size = group_size(group, cfg.actor)
        if size <= 1:
            continue
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
        config = getattr(config, "text_config", None) or config
        heads = getattr(config, "num_attention_heads", None)
        key = f"{section}.ulysses_sequence_parallel_size"
        if not heads or heads % size:
            raise ConfigError(key, size, f"the model's {heads} attention heads ({path}) do not split over {size} ranks "
                              "(each rank attends with heads / sp of them)", f"use a divisor of {heads}")
        layer_types = getattr(config, "layer_types", None) or ()
        if getattr(config, "use_sliding_window", False) or any("sliding" in str(t) for t in layer_types):
            raise ConfigError(key, size, f"the model ({path}) has sliding-window attention layers, which the "
                              "sequence-parallel attention does not build", f"set {key}=1")

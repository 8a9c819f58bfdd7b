"""Ulysses sequence parallelism's light functions (torch-free): the engine keyword argument of a
group's ``ulysses_sequence_parallel_size`` and its pre-flight check against the model.

The config rule is ``flowrl.config.sequence_parallel``'s, the engines
``flowrl.backends.train.ulysses``'s, the split arithmetic ``flowrl.data.sequence_split``'s.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_model", "group_size", "sequence_parallel_kwargs"]

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

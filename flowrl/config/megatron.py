"""``megatron`` of the actor and reference groups (verl's ``actor_rollout_ref.actor.megatron.*``
offload switches), read by the backends whose spec owns the ``megatron`` section
(``flowrl.backends.train.megatron.options.offload_kwargs``); a switch on under another
``actor.strategy`` is refused, naming the owners."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowrl.config.errors import check

__all__ = ["MEGATRON_SECTION", "MegatronConfig", "check_megatron_owner"]

MEGATRON_SECTION = "megatron"
"""The key a backend spec's ``config_keys`` holds when it reads this section."""


@dataclass(kw_only=True)
class MegatronConfig:
    param_offload: bool = False
    """The parameter buffers (megatron-core's ``_ParamAndGradBuffer``) in host memory whenever the
    engine is not computing, back before each of its phases (verl's ``param_offload``:
    ``offload_megatron_model_to_cpu`` / ``load_megatron_model_to_gpu``). On CPU: nothing moves."""
    grad_offload: bool = False
    """The gradient buffers dropped outside the engine's phases and back, zeroed, before them
    (verl's ``grad_offload``; they are zeroed before each step anyway). On CPU: nothing moves."""
    optimizer_offload: bool = False
    """The optimizer's state (and, with bf16, its fp32 main parameters) in host memory outside the
    update (verl's ``optimizer_offload``). On CPU: nothing moves."""

    def __post_init__(self) -> None:
        for name in ("param_offload", "grad_offload", "optimizer_offload"):
            value = getattr(self, name)
            check(isinstance(value, bool), name, value, "must be true or false", f"use {name}=true")

    @property
    def switched_on(self) -> list[str]:
        return [n for n in ("param_offload", "grad_offload", "optimizer_offload") if getattr(self, n)]


def check_megatron_owner(section: str, megatron: MegatronConfig, spec: Any, strategy: str, owners: str, *,
                         key_prefix: str = "") -> None:
    """``{section}.megatron.*`` switched on needs a strategy whose spec owns the section (the
    error's key: ``{key_prefix}megatron.<switch>``)."""
    on = megatron.switched_on
    check(not on or spec.owns(MEGATRON_SECTION), f"{key_prefix}megatron.{on[0] if on else ''}", True,
          f"is not an actor.strategy={strategy} option" + (f" (the {section} runs on actor.strategy)" if section != "actor" else ""),
          f"set actor.strategy={owners}, or {section}.megatron.{on[0] if on else ''}=false "
          "(fsdp: fsdp_config.param_offload / optimizer_offload)")

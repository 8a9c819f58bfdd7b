"""``megatron`` of the actor and reference groups (verl's ``actor_rollout_ref.actor.megatron.*``
offload switches, expert-parallel sizes and MoE router-loss coefficients), read by the backends
whose spec owns the ``megatron`` section (``flowrl.backends.train.megatron.options``); a switch on
(or a MoE setting off its default) under another ``actor.strategy`` is refused, naming the owners."""

from __future__ import annotations

import math
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

    expert_model_parallel_size: int = 1
    """Expert-parallel ranks of a mixture-of-experts model (verl's and Megatron's name): each holds
    ``num_experts / ep`` experts, and tokens reach them by all-to-all. Carved out of the
    data- x tensor-parallel ranks: ``ep * expert_tensor_parallel_size`` must divide
    ``data_parallel_size * tensor_model_parallel_size``."""
    expert_tensor_parallel_size: int | None = None
    """Tensor-parallel ranks inside each expert; null: ``tensor_model_parallel_size`` (Megatron's
    and verl's default)."""
    moe_aux_loss_coeff: float = 0.0
    """Megatron's load-balancing (switch ``aux_loss``) coefficient: > 0 adds ``coeff`` times each
    layer's load-balancing loss (its mean over the step's micro-batches) to the gradient and logs
    ``actor/moe/load_balancing_loss`` (verl: ``megatron.override_transformer_config.moe_aux_loss_coeff``)."""
    moe_z_loss_coeff: float | None = None
    """Megatron's router z-loss coefficient (ST-MoE); null: off. Logs ``actor/moe/z_loss``."""

    def __post_init__(self) -> None:
        for name in ("param_offload", "grad_offload", "optimizer_offload"):
            value = getattr(self, name)
            check(isinstance(value, bool), name, value, "must be true or false", f"use {name}=true")
        ep, etp = self.expert_model_parallel_size, self.expert_tensor_parallel_size
        check(isinstance(ep, int) and not isinstance(ep, bool) and ep >= 1, "expert_model_parallel_size", ep,
              "must be an integer >= 1", "use 1 (no expert parallelism) or a divisor of the model's experts")
        check(etp is None or (isinstance(etp, int) and not isinstance(etp, bool) and etp >= 1),
              "expert_tensor_parallel_size", etp, "must be null or an integer >= 1",
              "use null (the tensor-parallel size) or 1")
        for name in ("moe_aux_loss_coeff", "moe_z_loss_coeff"):
            value = getattr(self, name)
            if name == "moe_z_loss_coeff" and value is None:
                continue
            check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                  and value >= 0, name, value, "must be a finite number >= 0", f"use e.g. {name}=0.001")

    @property
    def switched_on(self) -> list[str]:
        """The switches on and the MoE settings off their defaults (megatron-only options)."""
        on = [n for n in ("param_offload", "grad_offload", "optimizer_offload") if getattr(self, n)]
        return on + [n for n, default in _MOE_DEFAULTS.items() if getattr(self, n) != default]


_MOE_DEFAULTS = {"expert_model_parallel_size": 1, "expert_tensor_parallel_size": None, "moe_aux_loss_coeff": 0.0,
                 "moe_z_loss_coeff": None}


def check_megatron_owner(section: str, megatron: MegatronConfig, spec: Any, strategy: str, owners: str, *,
                         key_prefix: str = "") -> None:
    """``{section}.megatron.*`` switched on needs a strategy whose spec owns the section (the
    error's key: ``{key_prefix}megatron.<switch>``)."""
    on = megatron.switched_on
    if not on or spec.owns(MEGATRON_SECTION):
        return
    key = on[0]
    near = " (fsdp: fsdp_config.param_offload / optimizer_offload)" if key not in _MOE_DEFAULTS else \
        " (fsdp shards experts like any parameter)"
    check(False, f"{key_prefix}megatron.{key}", getattr(megatron, key),
          f"is not an actor.strategy={strategy} option" + (f" (the {section} runs on actor.strategy)" if section != "actor" else ""),
          f"set actor.strategy={owners}, or {section}.megatron.{key}={_off(key)}{near}")


def _off(key: str) -> str:
    return {None: "null", 1: "1", 0.0: "0"}[_MOE_DEFAULTS[key]] if key in _MOE_DEFAULTS else "false"

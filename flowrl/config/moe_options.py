"""Pre-flight checks of the mixture-of-experts options (``actor.router_replay``,
``actor.moe_aux_loss_coeff`` / ``moe_z_loss_coeff``) against the rest of the config and the model's
``config.json``: before any worker starts, without importing torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flowrl.catalog.backends import GEN_BACKENDS, TRAIN_BACKENDS, either
from flowrl.config.errors import ConfigError

MOE_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
"""``config.json`` keys that give a transformers MoE model's expert count (Qwen2/3-MoE, Mixtral, DeepSeek)."""


def num_experts(model_path: str) -> int:
    """The model's experts per MoE layer from its ``config.json`` (0: a dense model or none readable)."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    return max((int(config.get(k) or 0) for k in MOE_EXPERT_KEYS), default=0)


def check_moe_options(cfg: Any, *, model_path: str) -> None:
    """Routing replay and the router losses need an MoE model on a strategy that hooks its routers;
    replay also a generation backend that records routes (``records_routes``: ``hf``; single-turn,
    whole responses).
    LoRA on an MoE model names its target modules (``all-linear`` would wrap the fused experts)."""
    m = cfg.model
    if m.lora_rank > 0 and m.target_modules == "all-linear" and num_experts(model_path) > 0:
        raise ConfigError("model.target_modules", "all-linear", f"on a mixture-of-experts model ({model_path}) makes "
                          "peft adapt the fused expert tensors, whose adapters flowrl cannot merge for the weight sync",
                          "name the attention projections: model.target_modules=[q_proj,k_proj,v_proj,o_proj]")
    a = cfg.actor
    coeffs = {k: getattr(a, k) for k in ("moe_aux_loss_coeff", "moe_z_loss_coeff") if getattr(a, k) > 0}
    if not (a.router_replay or coeffs):
        return
    key, value = ("actor.router_replay", True) if a.router_replay else next(
        (f"actor.{k}", v) for k, v in coeffs.items())
    if not TRAIN_BACKENDS.spec(a.strategy).router_replay:  # its forward hooks the routers (flowrl.models.moe_routing)
        hooks = either(TRAIN_BACKENDS.names_where(lambda s: s.router_replay))
        raise ConfigError(key, value, f"is built for actor.strategy={hooks}, not {a.strategy}",
                          f"set actor.strategy={hooks}, or {key}={'false' if value is True else 0}")
    if getattr(a, "ulysses_sequence_parallel_size", 1) > 1:
        raise ConfigError(key, value, "maps routes to whole sequences; Ulysses splits them over ranks",
                          f"set actor.ulysses_sequence_parallel_size=1, or {key}={'false' if value is True else 0}")
    if cfg.model.enable_gradient_checkpointing:
        raise ConfigError(key, value, "hooks the routers during the forward; model.enable_gradient_checkpointing "
                          "recomputes it in backward without them", f"set model.enable_gradient_checkpointing=false, "
                          f"or {key}={'false' if value is True else 0}")
    if num_experts(model_path) == 0:
        raise ConfigError(key, value, f"needs a mixture-of-experts model; {model_path} is dense (its config.json has "
                          f"none of {', '.join(MOE_EXPERT_KEYS)})",
                          "use an MoE model (the default task's: model.tiny=moe), or drop the option")
    if not a.router_replay:
        return
    if not GEN_BACKENDS.spec(cfg.rollout.name).records_routes:
        recorders = either(GEN_BACKENDS.names_where(lambda s: s.records_routes))
        raise ConfigError(key, value, f"replays the experts the rollout recorded, and rollout.name={cfg.rollout.name} "
                          "does not record them", f"set rollout.name={recorders}, or actor.router_replay=false")
    if cfg.rollout.multi_turn.enable:
        raise ConfigError(key, value, "replays routes of single-turn generation; multi-turn trajectories have none",
                          "set rollout.multi_turn.enable=false, or actor.router_replay=false")
    if cfg.trainer.async_mode == "stream":
        raise ConfigError(key, value, "replays routes of whole generate calls; the stream mode's continued "
                          "responses have none", "set trainer.async_mode to another mode, or actor.router_replay=false")

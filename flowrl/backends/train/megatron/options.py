"""The megatron backends' light functions, named by their specs in ``flowrl.catalog.backends``:
engine keyword arguments from a group's config and the pre-flight checks (the distributed
optimizer is checkpointed like the plain one: ``dist_optim``). No torch, no megatron
import: these run on the driver before any worker starts."""

from __future__ import annotations

import math
from typing import Any

from flowrl.config import ConfigError

_LAYOUT_FIX = "pick a layout from `flowrl parallel-plan` or the message above"


def _vpp(group_cfg: Any) -> int | None:
    vpp = getattr(group_cfg, "virtual_pipeline_model_parallel_size", 1)
    return vpp if vpp > 1 else None


#: verl's megatron offload switches (``actor_rollout_ref.actor.megatron.param_offload`` ...)
OFFLOAD_KEYS = ("param_offload", "grad_offload", "optimizer_offload")


def offload_kwargs(megatron_cfg: Any) -> dict:
    """``MegatronTrainEngine(offload=...)`` from a group's ``megatron`` section (verl's names);
    empty when the config has no such section or every switch is off."""
    if megatron_cfg is None:
        return {}
    switches = {k: bool(getattr(megatron_cfg, k)) for k in OFFLOAD_KEYS}
    return {"offload": switches} if any(switches.values()) else {}


def moe_kwargs(megatron_cfg: Any) -> dict:
    """``MegatronTrainEngine``'s expert mesh and router-loss coefficients from a group's
    ``megatron`` section, only those off their defaults (dense runs pass nothing new)."""
    if megatron_cfg is None:
        return {}
    out = {"ep": megatron_cfg.expert_model_parallel_size, "etp": megatron_cfg.expert_tensor_parallel_size,
           "moe_aux_loss_coeff": megatron_cfg.moe_aux_loss_coeff, "moe_z_loss_coeff": megatron_cfg.moe_z_loss_coeff}
    defaults = {"ep": 1, "etp": None, "moe_aux_loss_coeff": 0.0, "moe_z_loss_coeff": None}
    return {k: v for k, v in out.items() if v != defaults[k]}


def train_engine_kwargs(group_cfg: Any) -> dict:
    """``MegatronTrainEngine``'s mesh settings from an actor or reference config (and its
    ``megatron`` offload switches and expert settings, where the config has that section)."""
    return {
        "tp": group_cfg.tensor_model_parallel_size,
        "pp": group_cfg.pipeline_model_parallel_size,
        "dp": group_cfg.data_parallel_size,
        "vpp": _vpp(group_cfg),
        **({"use_distributed_optimizer": True} if getattr(group_cfg, "use_distributed_optimizer", False) else {}),
        **offload_kwargs(getattr(group_cfg, "megatron", None)),
        **moe_kwargs(getattr(group_cfg, "megatron", None)),
    }


def value_engine_kwargs(critic: Any) -> dict:
    """``MegatronValueTrainEngine``'s mesh settings from a critic config."""
    return {"tp": critic.tensor_model_parallel_size, "pp": critic.pipeline_model_parallel_size,
            "dp": critic.data_parallel_size}


def _hf_config(model_path: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path)


def _validate(group_cfg: Any, hf: Any, *, vpp: int | None, check_ffn: bool) -> None:
    """Heads, KV heads, layers, vocabulary (and the MLP width) against the group's (tp, pp)."""
    from flowrl.parallel.mesh import ParallelDims, validate_model_layout

    tp = group_cfg.tensor_model_parallel_size
    dims = ParallelDims(dp=group_cfg.data_parallel_size, tp=tp, pp=group_cfg.pipeline_model_parallel_size, vpp=vpp)
    validate_model_layout(dims, num_attention_heads=hf.num_attention_heads,
                          num_key_value_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
                          num_layers=hf.num_hidden_layers, vocab_size=hf.vocab_size)
    if check_ffn and hf.intermediate_size % tp:
        raise ValueError(f"tensor_model_parallel_size={tp} does not divide intermediate_size={hf.intermediate_size}")


def _experts(hf: Any) -> tuple[int, int] | None:
    """(experts, each expert's width) of a Qwen3-MoE / Mixtral config; None for a dense model."""
    model_type = getattr(hf, "model_type", None)
    if model_type == "qwen3_moe":
        return getattr(hf, "num_experts", None) or hf.num_local_experts, hf.moe_intermediate_size
    if model_type == "mixtral":
        return hf.num_local_experts, hf.intermediate_size
    return None


def check_expert_layout(name: str, group_cfg: Any, hf: Any, model_path: str) -> None:
    """``{name}.megatron.expert_*`` against the model and the group's mesh, before any worker
    starts: ep divides the experts, etp their width, ep * etp the dp x tp ranks (megatron carves
    the expert ranks out of them)."""
    megatron = getattr(group_cfg, "megatron", None)
    if megatron is None:
        return
    tp, dp = group_cfg.tensor_model_parallel_size, group_cfg.data_parallel_size
    ep = megatron.expert_model_parallel_size
    etp = megatron.expert_tensor_parallel_size or tp
    key = f"{name}.megatron.expert_model_parallel_size"
    experts = _experts(hf)
    if experts is None:
        if ep != 1 or etp != tp:
            raise ConfigError(key if ep != 1 else f"{name}.megatron.expert_tensor_parallel_size",
                              ep if ep != 1 else etp, f"the model in {model_path} has no experts (a dense model)",
                              f"set {name}.megatron.expert_model_parallel_size=1 and expert_tensor_parallel_size=null")
        return
    num_experts, width = experts
    if num_experts % ep:
        raise ConfigError(key, ep, f"does not divide the {num_experts} experts of the model in {model_path}",
                          f"use a divisor of {num_experts}")
    if width % etp:
        raise ConfigError(f"{name}.megatron.expert_tensor_parallel_size", etp,
                          f"does not divide the experts' width {width} (model in {model_path})",
                          f"use a divisor of {width}")
    if (dp * tp) % (ep * etp):
        raise ConfigError(key, ep, f"expert_model_parallel_size x expert_tensor_parallel_size = {ep} x {etp} does "
                          f"not divide data_parallel_size x tensor_model_parallel_size = {dp} x {tp} (the expert "
                          "ranks are carved out of the data- and tensor-parallel ranks)",
                          f"set {name}.data_parallel_size to a multiple of {ep * etp // math.gcd(ep * etp, tp)}, "
                          f"or a smaller {name}.megatron.expert_model_parallel_size")


def _layout_error(name: str, group_cfg: Any, model_path: str, exc: ValueError) -> ConfigError:
    return ConfigError(f"{name}.tensor_model_parallel_size/pipeline_model_parallel_size",
                       (group_cfg.tensor_model_parallel_size, group_cfg.pipeline_model_parallel_size),
                       f"does not fit the model in {model_path}: {exc}", _LAYOUT_FIX)


def check_train_layouts(cfg: Any, *, model_path: str) -> None:
    """``actor.strategy=megatron``: the actor's and (when needed) the reference's layout against
    the model in ``model_path``."""
    hf = _hf_config(model_path)
    groups = [("actor", cfg.actor)] + ([("ref", cfg.ref)] if cfg.needs_reference else [])
    for name, g in groups:
        try:
            _validate(g, hf, vpp=_vpp(g), check_ffn=False)
        except ValueError as exc:
            raise _layout_error(name, g, model_path, exc) from exc
        check_expert_layout(name, g, hf, model_path)


def check_value_layout(cfg: Any, *, model_path: str) -> None:
    """``critic.strategy=megatron``: the critic's (tp, pp) against its model in ``model_path``."""
    hf = _hf_config(model_path)
    try:
        _validate(cfg.critic, hf, vpp=None, check_ffn=True)
    except ValueError as exc:
        raise _layout_error("critic", cfg.critic, model_path, exc) from exc

"""The megatron backends' light functions, named by their specs in ``flowrl.catalog.backends``:
engine keyword arguments from a group's config and the pre-flight checks (the distributed
optimizer is checkpointed like the plain one: ``dist_optim``). No torch, no megatron
import: these run on the driver before any worker starts."""

from __future__ import annotations

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


def train_engine_kwargs(group_cfg: Any) -> dict:
    """``MegatronTrainEngine``'s mesh settings from an actor or reference config (and its
    ``megatron`` offload switches, where the config has that section)."""
    return {
        "tp": group_cfg.tensor_model_parallel_size,
        "pp": group_cfg.pipeline_model_parallel_size,
        "dp": group_cfg.data_parallel_size,
        "vpp": _vpp(group_cfg),
        **({"use_distributed_optimizer": True} if getattr(group_cfg, "use_distributed_optimizer", False) else {}),
        **offload_kwargs(getattr(group_cfg, "megatron", None)),
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


def check_value_layout(cfg: Any, *, model_path: str) -> None:
    """``critic.strategy=megatron``: the critic's (tp, pp) against its model in ``model_path``."""
    hf = _hf_config(model_path)
    try:
        _validate(cfg.critic, hf, vpp=None, check_ffn=True)
    except ValueError as exc:
        raise _layout_error("critic", cfg.critic, model_path, exc) from exc

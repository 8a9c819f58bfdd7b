"""The ``fsdp`` backend's light functions (named by its specs): its engine keyword arguments (``fsdp_config``, verl's names;
``model.enable_gradient_checkpointing``) and its pre-flight check. Torch-free."""

from __future__ import annotations

from typing import Any

from flowrl.config import ConfigError

__all__ = ["check_fsdp", "check_fsdp_critic", "engine_kwargs", "model_kwargs"]


def engine_kwargs(group_cfg: Any) -> dict:
    """``FSDPEngine`` keyword arguments from a group's ``fsdp_config`` (actor, ref, critic)."""
    f = group_cfg.fsdp_config
    mp = f.mixed_precision
    return {"reshard_after_forward": f.reshard_after_forward, "param_offload": f.param_offload,
            "optimizer_offload": f.optimizer_offload, "offload_policy": f.offload_policy, "param_dtype": mp.param_dtype,
            "reduce_dtype": mp.reduce_dtype, "buffer_dtype": mp.buffer_dtype}


def model_kwargs(model_cfg: Any) -> dict:
    """``FSDPEngine`` keyword arguments from ``model`` (the trained policy only)."""
    return {"gradient_checkpointing": model_cfg.enable_gradient_checkpointing}


def check_fsdp(cfg: Any, *, model_path: str) -> None:
    """The actor's and reference's fsdp groups are data parallel only (no tensor or pipeline axes)."""
    for section in ("actor", "ref"):
        _data_parallel_only(section, getattr(cfg, section))


def check_fsdp_critic(cfg: Any, *, model_path: str) -> None:
    """The critic's fsdp group is data parallel only."""
    _data_parallel_only("critic", cfg.critic)


def _data_parallel_only(section: str, group: Any) -> None:
    if group.tensor_model_parallel_size != 1 or group.pipeline_model_parallel_size != 1:
        raise ConfigError(f"{section}.tensor_model_parallel_size", group.tensor_model_parallel_size,
                          "the fsdp strategy shards over data-parallel ranks only",
                          f"set {section}.tensor_model_parallel_size=1 and pipeline_model_parallel_size=1, "
                          "or use the megatron strategy")

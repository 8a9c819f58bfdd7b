"""``fsdp_config`` of the actor, reference and critic groups (verl's names), read by the ``fsdp``
train and value backends; other strategies ignore it."""

from __future__ import annotations

from dataclasses import dataclass, field

from flowrl.config.errors import check, check_one_of
from flowrl.config.sections import DTYPES


@dataclass(kw_only=True)
class MixedPrecisionConfig:
    """FSDP2's mixed precision (verl's ``fsdp_config.mixed_precision``); None: the model's dtype."""

    param_dtype: str | None = None
    """Dtype of the unsharded parameters in forward and backward (``float32`` or ``bfloat16``)."""
    reduce_dtype: str | None = None
    """Dtype of the gradient reduce-scatter."""
    buffer_dtype: str | None = None
    """Dtype of the model's floating-point buffers (rotary tables)."""

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype", "buffer_dtype"):
            value = getattr(self, name)
            if value is not None:
                check_one_of(name, value, DTYPES)


@dataclass(kw_only=True)
class FSDPConfig:
    """How the ``fsdp`` strategy shards a group (verl's ``fsdp_config``)."""

    param_offload: bool = False
    """Move the sharded parameters and gradients to host memory whenever the engine is not
    computing, and back before each of its phases (verl's ``offload_fsdp_model_to_cpu`` /
    ``load_fsdp_model_to_gpu``): in the colocated and hybrid placements the generation engine
    then has the GPU's memory while it generates. On CPU they are in host memory already (the
    calls happen, nothing moves)."""
    optimizer_offload: bool = False
    """Move AdamW's state to host memory outside the update, and back before it (verl's
    ``offload_fsdp_optimizer`` / ``load_fsdp_optimizer``). On CPU: nothing moves."""
    offload_policy: bool = False
    """FSDP2's ``CPUOffloadPolicy`` (verl's ``fsdp_config.offload_policy``): the sharded
    parameters, gradients and AdamW's state live in host memory and the optimizer steps there;
    each forward copies a block's rows to the GPU. Replaces ``param_offload`` and
    ``optimizer_offload`` (nothing left on the GPU to move). On CPU: no effect."""
    reshard_after_forward: bool = True
    """Free the gathered parameters after each block's forward (gather again in backward)."""
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    """Parameter, gradient-reduction and buffer dtypes."""

    def __post_init__(self) -> None:
        moved = [n for n in ("param_offload", "optimizer_offload") if getattr(self, n)]
        check(not (self.offload_policy and moved), "offload_policy", self.offload_policy,
              f"is set together with {', '.join(moved)} (CPUOffloadPolicy keeps that state on the host already)",
              "set only offload_policy=true (state always on the host), or param_offload/optimizer_offload "
              "(moved to the host between phases)")

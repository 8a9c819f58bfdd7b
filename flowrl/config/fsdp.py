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
    """Keep the sharded parameters (and gradients, optimizer step) in host memory, FSDP2's
    ``CPUOffloadPolicy`` on GPU; on CPU they are there already (no effect)."""
    optimizer_offload: bool = False
    """Keep the optimizer state in host memory. Only together with ``param_offload``: FSDP2's
    ``CPUOffloadPolicy`` then holds the sharded parameters, gradients and AdamW state on the host
    and steps there; on its own (verl moves the state to the device and back around each step) it
    is not built and refused. On CPU everything is in host memory already."""
    reshard_after_forward: bool = True
    """Free the gathered parameters after each block's forward (gather again in backward)."""
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    """Parameter, gradient-reduction and buffer dtypes."""

    def __post_init__(self) -> None:
        check(self.param_offload or not self.optimizer_offload, "optimizer_offload", self.optimizer_offload,
              "alone is not built (the optimizer state is offloaded with the parameters, by param_offload)",
              "set fsdp_config.param_offload=true as well (parameters, gradients and AdamW state on the host), "
              "or optimizer_offload=false")

"""``fsdp_config`` of the actor, reference and critic groups (verl's names), read by the ``fsdp``
train and value backends; other strategies ignore it."""

from __future__ import annotations

from dataclasses import dataclass, field

from flowrl.config.errors import check_one_of
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
    """Keep the optimizer state in host memory; on CPU it is there already (no effect)."""
    reshard_after_forward: bool = True
    """Free the gathered parameters after each block's forward (gather again in backward)."""
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    """Parameter, gradient-reduction and buffer dtypes."""

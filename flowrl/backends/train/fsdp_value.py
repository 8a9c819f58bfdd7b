"""The ``fsdp`` backend for a value model (the PPO critic): ``dp_value``'s token-classification
model, sharded with FSDP2 as :class:`~flowrl.backends.train.fsdp_policy.FSDPEngine` shards a policy."""

from __future__ import annotations

import torch

from flowrl.backends.train.dp_value import TorchDPValueEngine
from flowrl.backends.train.fsdp_policy import FSDPEngine
from flowrl.data.packed import PackedBatch
from flowrl.models import vlm

__all__ = ["FSDPValueEngine"]


def classifier_on_meta(engine: TorchDPValueEngine, model_dir: str, dtype: torch.dtype) -> tuple | None:
    """``FSDPEngine._meta_model`` of a one-output classifier (``engine._classifier_class``): the
    backbone's parameters on the meta device (each rank then reads only its rows of the causal
    LM's checkpoint), the head real: the checkpoint's own, or ``value_head.new_head`` of the
    engine's seed (``torch.initial_seed()``), the same numbers on every rank and as the dp engine
    draws. None (load whole) without a safetensors checkpoint or with a backbone tensor it lacks."""
    import transformers

    from flowrl.backends.train.fsdp_load import checkpoint_index, checkpoint_names, params_on_meta
    from flowrl.backends.train.value_head import HEAD, head_from_checkpoint, new_head

    index = checkpoint_index(model_dir)
    if not index:
        return None
    config = engine._classifier_config(model_dir)
    vlm.register_auto_classes()  # a VLM's value model (flowrl.models.vlm_value)
    with params_on_meta():
        model = getattr(transformers, engine._classifier_class).from_config(config, dtype=dtype)
    head = getattr(model, HEAD)
    values = head_from_checkpoint(model_dir) or new_head(config, seed=torch.initial_seed(), bias=head.bias is not None)
    for part in ("weight", "bias"):
        if getattr(head, part) is not None:
            setattr(head, part, torch.nn.Parameter(values.get(part, torch.zeros(1)).to(dtype)))
    names = checkpoint_names(model, index, skip={f"{HEAD}.weight", f"{HEAD}.bias"})
    return (model, names, index) if names is not None else None


class FSDPValueEngine(FSDPEngine, TorchDPValueEngine):
    """``forward_values`` / ``train_step_values`` of ``dp_value``, every forward under the FSDP root."""

    def _meta_model(self, model_dir: str, dtype: torch.dtype) -> tuple | None:
        """Built on the meta device, the head real (:func:`classifier_on_meta`)."""
        return classifier_on_meta(self, model_dir, dtype)

    def _values(self, mb: PackedBatch) -> torch.Tensor:
        return self._root(TorchDPValueEngine._values, self, mb)

"""The ``fsdp`` backend for a value model (the PPO critic): ``dp_value``'s token-classification
model, sharded with FSDP2 as :class:`~flowrl.backends.train.fsdp_policy.FSDPEngine` shards a policy."""

from __future__ import annotations

import torch

from flowrl.backends.train.dp_value import TorchDPValueEngine
from flowrl.backends.train.fsdp_policy import FSDPEngine
from flowrl.data.packed import PackedBatch

__all__ = ["FSDPValueEngine"]


class FSDPValueEngine(FSDPEngine, TorchDPValueEngine):
    """``forward_values`` / ``train_step_values`` of ``dp_value``, every forward under the FSDP root."""

    def _meta_model(self, model_dir: str, dtype: torch.dtype) -> None:
        """The value head is new (not in the checkpoint): the model loads whole, as before."""
        return None

    def _values(self, mb: PackedBatch) -> torch.Tensor:
        return self._root(TorchDPValueEngine._values, self, mb)

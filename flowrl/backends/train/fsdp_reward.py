"""The ``fsdp`` reward-model engine: ``dp_reward``'s sequence-classification model sharded with
FSDP2, as :class:`~flowrl.backends.train.fsdp_value.FSDPValueEngine` shards a critic."""

from __future__ import annotations

import torch

from flowrl.backends.train.dp_reward import TorchDPRewardEngine
from flowrl.backends.train.fsdp_policy import FSDPEngine
from flowrl.backends.train.fsdp_value import classifier_on_meta
from flowrl.data.packed import PackedBatch

__all__ = ["FSDPRewardEngine"]


class FSDPRewardEngine(FSDPEngine, TorchDPRewardEngine):
    """``forward_values`` / ``train_step_values`` of ``dp_reward``, every forward under the FSDP root."""

    def _meta_model(self, model_dir: str, dtype: torch.dtype) -> tuple | None:
        """Built on the meta device, the head real (``fsdp_value.classifier_on_meta``)."""
        return classifier_on_meta(self, model_dir, dtype)

    def _values(self, mb: PackedBatch) -> torch.Tensor:
        return self._root(TorchDPRewardEngine._values, self, mb)

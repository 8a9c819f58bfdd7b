"""The value or reward model's one-output head as the engines read it: the head a checkpoint
holds (:func:`head_from_checkpoint`, for the engines that read safetensors shards themselves);
the new head and the whole-model load are :mod:`flowrl.models.value_head`, re-exported here.
"""

from __future__ import annotations

import torch

from flowrl.models.value_head import HEAD, HEAD_SEED_OFFSET, init_head, load_classifier, new_head

__all__ = ["HEAD", "HEAD_SEED_OFFSET", "head_from_checkpoint", "init_head", "load_classifier", "new_head"]


def head_from_checkpoint(model_dir: str) -> dict[str, torch.Tensor] | None:
    """The head a safetensors checkpoint holds (``score.weight`` / ``.bias``, float32), or None
    when it has none (a causal LM) or no safetensors files."""
    from flowrl.backends.train.fsdp_load import checkpoint_index

    index = checkpoint_index(model_dir)
    names = {part: f"{HEAD}.{part}" for part in ("weight", "bias") if f"{HEAD}.{part}" in index}
    if "weight" not in names:
        return None
    from safetensors import safe_open

    out = {}
    for part, name in names.items():
        with safe_open(index[name], framework="pt") as f:
            out[part] = f.get_tensor(name).float()
    return out

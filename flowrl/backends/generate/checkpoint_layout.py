"""A trainer's HF state in the layout of a checkpoint on disk, for engines whose loaders read
checkpoints (vLLM's ``load_weights``).

transformers 5 holds some models in memory under other names and shapes than their checkpoints:
a Mixtral's ``mlp.experts.gate_up_proj`` (all experts fused) is ``block_sparse_moe.experts.{e}.w1``
/ ``w3`` on disk, and ``save_pretrained`` writes the disk form by reversing the load's conversion
(``transformers.core_model_loading.revert_weight_conversion``). The same reversal here gives vLLM
the names its loader knows; a model without conversions passes through unchanged.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=4)
def _skeleton(model_dir: str) -> Any:
    """``model_dir``'s model class on the meta device (no memory): what the reversal reads its
    conversions from."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    cls = getattr(transformers, (config.architectures or [""])[0], None) or transformers.AutoModelForCausalLM
    with torch.device("meta"):
        return cls._from_config(config) if hasattr(cls, "_from_config") else cls.from_config(config)


def checkpoint_layout(state: dict[str, Any], model_dir: str | None) -> dict[str, Any]:
    """``state`` (transformers' in-memory names, whole tensors) under the checkpoint's names and
    shapes; the same dict when the model has no conversion (dense models, Qwen2/3) or no
    directory is known (``None``: the names are taken as they are)."""
    from transformers.core_model_loading import revert_weight_conversion

    if model_dir is None:
        return state

    out = revert_weight_conversion(_skeleton(model_dir), dict(state))
    return out if out.keys() != state.keys() else state

"""Training that starts from a saved LoRA adapter (``model.lora_adapter_path``, verl's
``actor_rollout_ref.model.lora_adapter_path``): a peft adapter directory (``adapter_config.json``
and ``adapter_model.safetensors`` or ``.bin``, as ``save_pretrained`` and ``flowrl export-hf
--adapter-only`` write it) on top of ``model.path``.

As verl (``PeftModel.from_pretrained(..., is_trainable=True)``), the adapter's own settings apply:
:func:`flowrl.config.lora_adapter_path.adapter_settings` reads its rank, alpha, target modules and
``modules_to_save`` into ``model.*`` before any worker starts (``resolve_adapter``; a
``model.lora_rank`` set and different is refused), the engines inject fresh adapters of those
settings and :func:`load_adapter_weights` copies the saved tensors into them, every adapter
tensor accounted for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["load_adapter_weights"]

KEY = "model.lora_adapter_path"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def load_adapter_weights(peft_model: Any, path: str) -> int:
    """Copy the adapter in ``path`` into ``peft_model``'s fresh adapters (peft's
    ``set_peft_model_state_dict``); the number of tensors loaded. ValueError when a saved tensor
    has no place in the model or an adapter of the model gets none (a different base model)."""
    from peft import set_peft_model_state_dict

    directory = Path(path)
    file = next(directory / name for name in WEIGHT_FILES if (directory / name).is_file())
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(file))
    else:
        import torch

        tensors = torch.load(file, map_location="cpu", weights_only=True)
    result = set_peft_model_state_dict(peft_model, tensors)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    missing = [k for k in (getattr(result, "missing_keys", []) or []) if ".lora_" in k or "modules_to_save" in k]
    if unexpected or missing:
        raise ValueError(f"{KEY}={path}: the adapter does not fit model.path ({len(unexpected)} saved tensors with no "
                         f"place, e.g. {unexpected[:2]}; {len(missing)} adapters not loaded, e.g. {missing[:2]}); fix: "
                         "use the adapter trained on this base model")
    return len(tensors)

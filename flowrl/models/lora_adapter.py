"""Training that starts from a saved LoRA adapter (``model.lora_adapter_path``, verl's
``actor_rollout_ref.model.lora_adapter_path``): a peft adapter directory (``adapter_config.json``
and ``adapter_model.safetensors`` or ``.bin``, as ``save_pretrained`` and ``flowrl export-hf
--adapter-only`` write it) on top of ``model.path``.

As verl (``PeftModel.from_pretrained(..., is_trainable=True)``), the adapter's own settings apply:
:func:`adapter_settings` reads its rank, alpha, target modules and ``modules_to_save`` into
``model.*`` before any worker starts (:func:`resolve_adapter`; a ``model.lora_rank`` set and
different is refused), the engines inject fresh adapters of those settings and
:func:`load_adapter_weights` copies the saved tensors into them, every adapter tensor accounted for.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from flowrl.config import ConfigError

__all__ = ["adapter_settings", "load_adapter_weights", "resolve_adapter"]

KEY = "model.lora_adapter_path"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def adapter_settings(path: str) -> dict[str, Any]:
    """``{"lora_rank", "lora_alpha", "target_modules", "modules_to_save"}`` of the adapter in
    ``path`` (peft's ``adapter_config.json``); ConfigError naming the key, the path and the fix."""
    directory = Path(path)
    config_file = directory / "adapter_config.json"
    if not config_file.is_file():
        raise ConfigError(KEY, path, "is not a peft adapter directory (no adapter_config.json)",
                          "point it at a directory written by save_pretrained (or flowrl export-hf --adapter-only)")
    if not any((directory / name).is_file() for name in WEIGHT_FILES):
        raise ConfigError(KEY, path, f"holds no adapter weights ({' or '.join(WEIGHT_FILES)})",
                          "save the adapter into it with peft_model.save_pretrained(DIR)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(KEY, path, f"has an invalid adapter_config.json ({exc})", "re-save the adapter") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(KEY, path, f"holds a {config.get('peft_type')} adapter, not LoRA", "use a LoRA adapter")
    unsupported = [k for k in ("use_dora", "use_rslora") if config.get(k)]
    if unsupported:
        raise ConfigError(KEY, path, f"uses {', '.join(unsupported)}, which flowrl's LoRA does not build",
                          "use a plain LoRA adapter")
    targets = config.get("target_modules") or "all-linear"
    if isinstance(targets, str) and targets not in ("all-linear",):
        raise ConfigError(KEY, path, f"targets modules by the pattern {targets!r}",
                          "use an adapter saved with a list of module names (or all-linear)")
    return {"lora_rank": int(config["r"]), "lora_alpha": int(config.get("lora_alpha") or config["r"]),
            "target_modules": targets if isinstance(targets, str) else sorted(targets),
            "modules_to_save": list(config.get("modules_to_save") or [])}


def resolve_adapter(cfg: Any) -> Any:
    """``cfg`` with ``model.lora_*`` set from ``model.lora_adapter_path``'s adapter (unchanged
    without one). A ``model.lora_rank`` > 0 that differs from the adapter's is refused."""
    path = getattr(cfg.model, "lora_adapter_path", "")
    if not path:
        return cfg
    settings = adapter_settings(path)
    if cfg.model.lora_rank and cfg.model.lora_rank != settings["lora_rank"]:
        raise ConfigError("model.lora_rank", cfg.model.lora_rank,
                          f"differs from the rank {settings['lora_rank']} of the adapter in {KEY}={path}",
                          "leave model.lora_rank=0 (the adapter's settings apply, as in verl) or drop lora_adapter_path")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **settings))


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

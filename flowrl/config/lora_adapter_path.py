"""``model.lora_adapter_path`` before any worker starts: the saved adapter's settings
(:func:`adapter_settings`) become ``model.*`` (:func:`resolve_adapter`); the engines then load its
tensors (:func:`flowrl.models.lora_adapter.load_adapter_weights`)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from flowrl.config.errors import ConfigError
from flowrl.models.lora_adapter import KEY, WEIGHT_FILES

__all__ = ["adapter_settings", "resolve_adapter"]


def adapter_settings(path: str) -> dict[str, Any]:
    """``{"lora_rank", "lora_alpha", "target_modules", "modules_to_save", "exclude_modules"}`` of the
    adapter in ``path`` (peft's ``adapter_config.json``); ConfigError naming the key, the path and the fix."""
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
            "modules_to_save": list(config.get("modules_to_save") or []),
            "exclude_modules": exclude_pattern(config.get("exclude_modules"))}


def exclude_pattern(excluded: Any) -> str:
    """peft's ``exclude_modules`` as the one regular expression of ``model.exclude_modules``: a
    string is one already (peft: ``re.fullmatch``); a list of names becomes the pattern peft's list
    means (a module named so, or whose name ends in ``.`` + one of them); none: empty."""
    if not excluded:
        return ""
    if isinstance(excluded, str):
        return excluded
    return r"(?:.*\.)?(?:" + "|".join(re.escape(name) for name in sorted(excluded)) + ")"


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

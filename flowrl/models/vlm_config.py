"""Whether a model is a vision-language model, from its config alone (no torch, no transformers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VLM_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")


def is_vlm_config(config: Any) -> bool:
    """Whether a transformers config (or its dict) is a vision-language model's."""
    if isinstance(config, dict):
        return config.get("model_type") in VLM_MODEL_TYPES or "vision_config" in config
    return getattr(config, "model_type", None) in VLM_MODEL_TYPES or hasattr(config, "vision_config")


def is_vlm_dir(model_dir: str) -> bool:
    """Whether ``model_dir``'s ``config.json`` is a vision-language model's (False when unreadable)."""
    try:
        return is_vlm_config(json.loads((Path(model_dir) / "config.json").read_text()))
    except (OSError, ValueError, TypeError):
        return False

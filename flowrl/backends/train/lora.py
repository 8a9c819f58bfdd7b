"""Pre-flight of LoRA (``model.lora_rank`` > 0) for the train backends that build it (``dp``,
``fsdp``: the ``lora`` field of their specs in :mod:`flowrl.catalog.backends`): the adapters' target modules
exist in the model, checked on a model built on the meta device (no weights read), before any
worker starts. The adapters themselves: :mod:`flowrl.models.lora`, injected by the engines
(``TorchDPEngine._add_adapters``). :func:`adapter_layout`: the adapters' names and shapes, which
both ends of the adapter-only weight sync (:mod:`flowrl.backends.reshard.adapters`) derive alike."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any, Mapping

from flowrl.config import ConfigError

__all__ = ["adapter_layout", "check_lora", "linear_module_names", "sync_names"]


def linear_module_names(model_path: str) -> set[str]:
    """Last name parts of the model's linear layers (``q_proj``, ``c_attn``, ``lm_head``, ...),
    from its ``config.json`` on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))}


def adapter_layout(model_path: str, lora: dict) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """What the trainer trains with LoRA ``lora`` (``LoraSpec.to_dict()``) on the model in
    ``model_path``, by :func:`sync_names`, with shapes, in the model's parameter order: the
    adapters (and any module peft trains whole, ``modules_to_save``). From a model built on the
    meta device (no weights read), once per process."""
    from flowrl.models.lora import LoraSpec

    return _adapter_layout(model_path, LoraSpec.from_dict(lora))


@lru_cache(maxsize=4)
def _adapter_layout(model_path: str, spec: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from flowrl.models.lora import add_adapters

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    add_adapters(model, spec)
    named = sync_names({n: p for n, p in model.named_parameters() if p.requires_grad})
    return tuple((name, tuple(t.shape)) for name, t in named.items())


def sync_names(trained: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer's trained tensors (peft-wrapped names) by the names the generation engine takes:
    adapters by peft's saved names (``base_model.model....q_proj.lora_A.weight``), a module trained
    whole (peft's ``modules_to_save`` copy, ``model.embed_tokens.modules_to_save.default.weight``)
    by the plain model's name (``model.embed_tokens.weight``). Order kept."""
    from flowrl.models.lora import ADAPTER, adapter_checkpoint_tensors, is_adapter

    out = {}
    for name, t in trained.items():
        if is_adapter(name):
            out.update(adapter_checkpoint_tensors({name: t}))
        else:
            out[name.replace(f".modules_to_save.{ADAPTER}.", ".")] = t
    return out


def check_lora(cfg: Any, *, model_path: str | None) -> None:
    """``model.target_modules`` names linear layers of the model in ``model_path`` (``all-linear``
    always does) and ``model.modules_to_save`` names modules of it; raises
    :class:`~flowrl.config.ConfigError` naming the missing ones."""
    from flowrl.models.lora import LoraSpec

    spec = LoraSpec.from_config(cfg.model)
    if not model_path or not os.path.isfile(os.path.join(model_path, "config.json")):
        return
    if spec.modules_to_save:
        _require_names("model.modules_to_save", cfg.model.modules_to_save, spec.modules_to_save,
                       module_names(model_path), f"names no module of {model_path}", "use some of: ")
    if not isinstance(spec.target_modules, str):
        _require_names("model.target_modules", cfg.model.target_modules, spec.target_modules,
                       linear_module_names(model_path), f"names no linear layer of {model_path}",
                       "use all-linear, or some of: ")


def _require_names(key: str, value: Any, wanted: Any, have: set[str], problem: str, fix: str) -> None:
    """Raise :class:`~flowrl.config.ConfigError` for ``key`` when a name in ``wanted`` is not in
    ``have``; the fix lists ``have`` (without container indices such as ``0``)."""
    missing = [t for t in wanted if t not in have]
    if missing:
        raise ConfigError(key, value, f"{problem}: {', '.join(missing)}",
                          fix + ", ".join(sorted(n for n in have if not n.isdigit())))


def module_names(model_path: str) -> set[str]:
    """Last name parts of every module of the model (``embed_tokens``, ``norm``, ``q_proj``, ...)."""
    return {name.rsplit(".", 1)[-1] for name in _meta_module_names(model_path)}


def _meta_module_names(model_path: str) -> list[str]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    return [name for name, _ in model.named_modules() if name]

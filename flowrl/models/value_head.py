"""The one-output head of a value model (the PPO critic) or reward model (the ``rm`` family): the
same numbers on every backend and every rank, without loading the whole model.

A causal LM's checkpoint has no ``score`` head: the head is new. transformers draws a new head
from torch's global generator inside ``from_pretrained``, which only the backends that load the
whole model can reproduce. Here it is a pure function of the seed (:func:`new_head`): a normal of
std ``config.initializer_range`` (transformers' ``_init_weights`` for a ``Linear``; bias zero)
from its own generator, so the dp engine, each FSDP rank building the model on the meta device
and each megatron rank reading only its shard start from the same head. A checkpoint that has
the head (a trained critic or reward model, under the HF name ``score.weight``) keeps its own
(``flowrl.backends.train.value_head.head_from_checkpoint``, for the engines that read shards).

Shape letters: H hidden size.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["HEAD", "HEAD_SEED_OFFSET", "init_head", "load_classifier", "new_head"]

HEAD = "score"
"""The head's module name in transformers' token- and sequence-classification models."""

HEAD_SEED_OFFSET = 0x5C0BE
"""Added to the run's seed for the head's generator (not the stream the rest of the run draws)."""


def _std(config: Any) -> float:
    std = getattr(config, "initializer_range", None)
    if std is None and hasattr(config, "get_text_config"):
        std = getattr(config.get_text_config(), "initializer_range", None)
    return float(std or 0.02)


def new_head(config: Any, *, seed: int, bias: bool) -> dict[str, torch.Tensor]:
    """``{"weight": (1, H), "bias": (1,)?}`` in float32: the new head of seed ``seed``."""
    generator = torch.Generator().manual_seed(int(seed) + HEAD_SEED_OFFSET)
    hidden = getattr(config, "hidden_size", None) or config.get_text_config().hidden_size  # a VLM's: its text model's
    out = {"weight": torch.empty(1, hidden).normal_(0.0, _std(config), generator=generator)}
    if bias:
        out["bias"] = torch.zeros(1)
    return out


def init_head(model: torch.nn.Module, *, seed: int) -> None:
    """Set ``model.score`` (a transformers classifier whose head is new: not in its checkpoint) to
    :func:`new_head` of ``seed``."""
    head = getattr(model, HEAD)
    values = new_head(model.config, seed=seed, bias=head.bias is not None)
    with torch.no_grad():
        head.weight.copy_(values["weight"].to(head.weight.dtype))
        if head.bias is not None:
            head.bias.copy_(values["bias"].to(head.bias.dtype))


def load_classifier(model_cls: Any, model_dir: str, config: Any, *, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """``model_cls.from_pretrained`` (a token- or sequence-classification class) with a new head
    set by :func:`init_head` (a checkpoint's own head is kept). torch's generator is left as it
    was (transformers' own draw for the new head is undone), as a model built on the meta device
    leaves it: what is drawn next (LoRA's adapters) is the same on every backend."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # "score head newly initialised" is the point
    try:
        with torch.random.fork_rng(devices=[]):
            model, info = model_cls.from_pretrained(model_dir, config=config, dtype=dtype, output_loading_info=True)
    finally:
        transformers.logging.set_verbosity(verbosity)
    if f"{HEAD}.weight" in info["missing_keys"]:
        init_head(model, seed=seed)
    return model

"""Export a flowrl checkpoint as a Hugging Face ``transformers`` directory.

The model is built (on the meta device, no initialisation) from the ``config.json`` in
``config_dir``, filled with the checkpoint's full parameters and written with ``save_pretrained``
(safetensors); tokenizer files and ``generation_config.json`` are copied from ``config_dir``.
"""

from __future__ import annotations

import os
import shutil

from flowrl.checkpoint.loading import check_params, load_full

__all__ = ["TOKENIZER_FILES", "export_hf"]

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "chat_template.jinja",
    "chat_template.json", "generation_config.json",
)
"""Files copied from ``config_dir`` when present."""


def export_hf(path: str | os.PathLike, out_dir: str | os.PathLike,
              config_dir: str | os.PathLike) -> str:
    """Write checkpoint ``path`` as a transformers directory ``out_dir`` that ``from_pretrained``
    loads. ``config_dir``: the HF directory the run started from (its ``config.json`` and
    tokenizer). Returns ``out_dir``. ValueError if the checkpoint is of another model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dir, out_dir = os.fspath(config_dir), os.fspath(out_dir)
    if not os.path.isfile(os.path.join(config_dir, "config.json")):
        raise ValueError(f"{os.path.join(config_dir, 'config.json')} is missing; config_dir must be "
                         "the Hugging Face model directory the run started from")
    config = AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    check_params(path, shapes)
    state = load_full(path, as_torch=True)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    meta_left = [n for n, t in model.state_dict().items() if t.is_meta]
    assert not meta_left, f"parameters left on the meta device: {meta_left[:3]}"
    # Non-persistent buffers (rotary inv_freq) are recomputed by from_pretrained; never saved.
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in TOKENIZER_FILES:
        src = os.path.join(config_dir, name)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(out_dir, name))
    return out_dir

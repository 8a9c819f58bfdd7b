"""Export a flowrl checkpoint as a Hugging Face ``transformers`` directory.

The model is built (on the meta device, no initialisation) from the ``config.json`` in
``config_dir``, filled with the checkpoint's full parameters and written with ``save_pretrained``
(safetensors); tokenizer files and ``generation_config.json`` are copied from ``config_dir``. A
reward model's checkpoint (the ``rm`` family's, with a ``score`` head) is written as a one-label
sequence-classification model.

Mixture-of-experts models (Qwen3-MoE, Mixtral): the checkpoint holds every expert's weights under
its per-expert name (``mlp.experts.{e}.gate_proj.weight`` ...), transformers 5 holds them fused in
memory (``mlp.experts.gate_up_proj`` (E, 2F, h), ``mlp.experts.down_proj`` (E, h, F)): they are
stacked into those, and ``save_pretrained`` writes the model's own per-expert checkpoint names
(Mixtral's ``block_sparse_moe.experts.{e}.w1`` ...).

A LoRA checkpoint (``model.lora_rank`` > 0: the adapters only, their settings in
``extra.lora``) needs ``lora="merge"`` (``flowrl export-hf --merge-lora``: the base model of
``config_dir``, which LoRA never changes, with ``W + (alpha / r) B A`` merged in: a plain
transformers directory) or ``lora="adapter"`` (``--adapter-only``: peft's adapter directory,
``adapter_config.json`` + ``adapter_model.safetensors``, that ``PeftModel.from_pretrained(base,
out_dir)`` loads onto the base model).
"""

from __future__ import annotations

import os
import shutil

from flowrl.checkpoint.loading import check_params, load_full, load_meta

__all__ = ["TOKENIZER_FILES", "export_hf", "fuse_experts", "per_expert_shapes"]

_FUSED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
"""transformers 5's fused expert tensors (the names end so in every MoE model it builds)."""


def per_expert_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """A transformers 5 state dict's shapes with each fused expert tensor replaced by the per-expert
    parameters a checkpoint holds (``ModelShape.param_shapes``' names)."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if name.endswith(_FUSED[0]):  # (E, 2F, h)
            prefix = name[: -len("gate_up_proj")]
            for e in range(shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = (shape[1] // 2, shape[2])
                out[f"{prefix}{e}.up_proj.weight"] = (shape[1] // 2, shape[2])
        elif name.endswith(_FUSED[1]):  # (E, h, F)
            prefix = name[: -len("down_proj")]
            for e in range(shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = tuple(shape[1:])
        else:
            out[name] = shape
    return out


def fuse_experts(state: dict, shapes: dict[str, tuple[int, ...]]) -> dict:
    """``state`` (per-expert names, torch tensors) with the experts of every fused tensor named in
    ``shapes`` stacked into it: ``gate_up_proj[e] = [gate_e; up_e]``, ``down_proj[e] = down_e``."""
    import torch

    out = dict(state)
    for name, shape in shapes.items():
        if not name.endswith(_FUSED):
            continue
        prefix = name[: name.rindex(".") + 1]
        if name.endswith(_FUSED[0]):
            parts = [torch.cat([out.pop(f"{prefix}{e}.gate_proj.weight"),
                                out.pop(f"{prefix}{e}.up_proj.weight")]) for e in range(shape[0])]
        else:
            parts = [out.pop(f"{prefix}{e}.down_proj.weight") for e in range(shape[0])]
        out[name] = torch.stack(parts)
    return out

REWARD_HEAD = "score.weight"
"""A reward model's checkpoint (``algorithm.family=rm``) holds this head: it is exported as
``AutoModelForSequenceClassification`` with one label, a ``reward_model.model_path``."""

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "chat_template.jinja",
    "chat_template.json", "generation_config.json",
)
"""Files copied from ``config_dir`` when present."""


def export_hf(path: str | os.PathLike, out_dir: str | os.PathLike,
              config_dir: str | os.PathLike, *, lora: str | None = None) -> str:
    """Write checkpoint ``path`` as a transformers directory ``out_dir`` that ``from_pretrained``
    loads. ``config_dir``: the HF directory the run started from (its ``config.json`` and
    tokenizer). ``lora``: for a LoRA checkpoint, ``"merge"`` or ``"adapter"`` (see the module).
    Returns ``out_dir``. ValueError if the checkpoint is of another model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dir, out_dir = os.fspath(config_dir), os.fspath(out_dir)
    if not os.path.isfile(os.path.join(config_dir, "config.json")):
        raise ValueError(f"{os.path.join(config_dir, 'config.json')} is missing; config_dir must be "
                         "the Hugging Face model directory the run started from")
    saved_lora = (load_meta(path).get("extra") or {}).get("lora")
    if lora not in (None, "merge", "adapter"):
        raise ValueError(f"lora={lora!r}: use 'merge' (--merge-lora) or 'adapter' (--adapter-only)")
    if saved_lora is None and lora is not None:
        raise ValueError(f"{path} holds every weight, no LoRA adapters (its run had model.lora_rank=0); "
                         "fix: export it without --merge-lora / --adapter-only")
    if saved_lora is not None:
        if lora is None:
            raise ValueError(f"{path} holds LoRA adapters only ({saved_lora}); fix: pass --merge-lora (a full "
                             "model, adapters merged into the base) or --adapter-only (peft's adapter directory)")
        return _export_lora(path, out_dir, config_dir, saved_lora, merge=lora == "merge")
    config = AutoConfig.from_pretrained(config_dir)
    model_cls = AutoModelForCausalLM
    if REWARD_HEAD in load_meta(path)["params"]:  # the rm family's: a one-output classification head
        from transformers import AutoModelForSequenceClassification

        model_cls, config.num_labels = AutoModelForSequenceClassification, 1
        config.pad_token_id = 0 if config.pad_token_id is None else config.pad_token_id
    with torch.device("meta"):
        model = model_cls.from_config(config)
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    check_params(path, per_expert_shapes(shapes))
    state = fuse_experts(load_full(path, as_torch=True), shapes)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    meta_left = [n for n, t in model.state_dict().items() if t.is_meta]
    assert not meta_left, f"parameters left on the meta device: {meta_left[:3]}"
    # Non-persistent buffers (rotary inv_freq) are recomputed by from_pretrained; never saved.
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    _copy_tokenizer(config_dir, out_dir)
    return out_dir


def _copy_tokenizer(config_dir: str, out_dir: str) -> None:
    for name in TOKENIZER_FILES:
        src = os.path.join(config_dir, name)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(out_dir, name))


def _export_lora(path: str | os.PathLike, out_dir: str, config_dir: str, lora: dict, *, merge: bool) -> str:
    """The base model of ``config_dir`` with checkpoint ``path``'s adapters: merged into a plain
    transformers directory, or peft's adapter directory."""
    import torch
    from transformers import AutoModelForCausalLM

    from flowrl.models.lora import LoraSpec, add_adapters, is_trained

    adapters = load_full(path, as_torch=True)
    dtype = next(iter(adapters.values())).dtype
    if REWARD_HEAD.replace(".", ".modules_to_save.default.") in adapters:  # the rm family's head, trained whole
        from flowrl.models.reward_model import add_reward_adapters, load_reward_model

        model = load_reward_model(config_dir, dtype)
        peft_model = add_reward_adapters(model, lora)[1]
    else:
        model = AutoModelForCausalLM.from_pretrained(config_dir, dtype=dtype)
        peft_model = add_adapters(model, LoraSpec.from_dict(lora))
    named = {n: p for n, p in model.named_parameters() if is_trained(n)}  # and modules_to_save copies
    check_params(path, {n: tuple(p.shape) for n, p in named.items()})
    with torch.no_grad():
        for n, p in named.items():
            p.copy_(adapters[n])
    os.makedirs(out_dir, exist_ok=True)
    if merge:
        peft_model.merge_and_unload().save_pretrained(out_dir, safe_serialization=True)
    else:
        peft_model.save_pretrained(out_dir, safe_serialization=True)
    _copy_tokenizer(config_dir, out_dir)
    return out_dir

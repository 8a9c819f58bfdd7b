"""Vision-language models (Qwen2-VL / Qwen2.5-VL): the model-level pieces the ``hf`` decode loop
and the ``dp`` / FSDP2 trainers use when a batch has images (their forward and decode loops,
which need the engines' helpers, are :mod:`flowrl.backends.vlm`).

* :func:`register_auto_classes` makes ``AutoModelForCausalLM`` load ``qwen2_vl`` /
  ``qwen2_5_vl`` checkpoints as their ``...ForConditionalGeneration`` (transformers 5 maps them to
  ``AutoModelForImageTextToText`` only), so every loader of the framework takes a VLM unchanged,
  and ``AutoModelForTokenClassification`` build their value model (the critic:
  :mod:`flowrl.models.vlm_value`).
* :func:`mrope_positions` is a sequence's multimodal rotary positions (``[3, L]``: time, height,
  width; text tokens have three equal ones) from the model's own ``get_rope_index``, computed per
  sequence without padding, then placed into whatever layout the batch has: padded rows (with the
  attention mask), or packed lines (``[4, R, C]``: the per-sequence text positions first, from
  which transformers builds the block-causal mask, then the three rotary rows), so packing keeps
  every sequence's positions exactly.
* :func:`text_positions` / :func:`slot_rows` place a layout's slots in their sequences and rows.
* :func:`param_shapes`: the model's parameters by name and shape, for the weight sync's layouts.
* :func:`freeze_vision_tower` stops gradients into the vision tower (``actor.freeze_vision_tower``).

Shape letters: B rows, L padded length, R packed lines, C line capacity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from flowrl.models.vlm_config import VLM_MODEL_TYPES, is_vlm_config, is_vlm_dir  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from flowrl.data.packed import PackedBatch, Padded

PROCESSOR_ATTR = "_flowrl_image_processor"


def register_auto_classes() -> None:
    """``AutoModelForCausalLM`` builds Qwen2-VL and Qwen2.5-VL, ``AutoModelForTokenClassification``
    their value models (idempotent)."""
    from transformers import (
        AutoModelForCausalLM,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )

    for config_cls, model_cls in ((Qwen2VLConfig, Qwen2VLForConditionalGeneration),
                                  (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration)):
        AutoModelForCausalLM.register(config_cls, model_cls, exist_ok=True)
    from flowrl.models import vlm_value

    vlm_value.register()


def param_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Every parameter of the model saved in ``model_dir`` under its in-memory HF name (vision tower
    and language model; tied weights once), with its shape: the module built on the meta device
    (no weights read), as the trainers and the ``hf`` generator name them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    register_auto_classes()
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The vision encoder (with its merger) of a Qwen2-VL-style model, or None."""
    inner = getattr(model, "model", model)
    return getattr(inner, "visual", None)


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """Stop gradients into the vision tower; the number of parameters frozen (0: not a VLM)."""
    tower = vision_tower(model)
    if tower is None:
        return 0
    tower.requires_grad_(False)
    return sum(p.numel() for p in tower.parameters())


def image_processor_of(model: torch.nn.Module) -> Any:
    """The image processor saved with the model (``preprocessor_config.json`` of its directory),
    loaded once and kept on the module."""
    processor = getattr(model, PROCESSOR_ATTR, None)
    if processor is None:
        from flowrl.data.images import load_image_processor

        where = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "")
        processor = load_image_processor(where)
        if processor is None:
            raise ValueError(f"the vision-language model loaded from {where!r} has no image processor "
                             "(preprocessor_config.json); save it with the model (processor.save_pretrained(DIR))")
        object.__setattr__(model, PROCESSOR_ATTR, processor)
    return processor


def inner_model(model: torch.nn.Module) -> Any:
    """The ``Qwen2VLModel`` (vision tower + language model) of a ``...ForConditionalGeneration``."""
    return getattr(model, "model", model)


def unwrap_peft(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper, if any."""
    base = getattr(model, "base_model", None)
    return getattr(base, "model", model) if base is not None and base is not model else model


def mrope_positions(model: torch.nn.Module, ids_L: torch.Tensor, grid_thw: torch.Tensor | None,
                    prompt_len: int | None = None) -> torch.Tensor:
    """``[3, L]`` rotary positions of one unpadded sequence whose images have ``grid_thw``; only
    the first ``prompt_len`` tokens (default: all) may be image tokens (an ``<|image_pad|>`` the
    policy sampled in its response is a text token, as generation fed it)."""
    ids_1L = ids_L.long().reshape(1, -1)
    if grid_thw is None or grid_thw.numel() == 0:
        return torch.arange(ids_1L.shape[1], device=ids_L.device).expand(3, -1).clone()
    inner = inner_model(unwrap_peft(model))
    token_types = (ids_1L == model.config.image_token_id).int()
    if prompt_len is not None:
        token_types[:, prompt_len:] = 0
    positions, _ = inner.get_rope_index(ids_1L, mm_token_type_ids=token_types, image_grid_thw=grid_thw.to(ids_L.device))
    return positions[:, 0].long()


def image_inputs(model: torch.nn.Module, images_B: Sequence[Sequence[bytes]]) -> tuple[dict, list[torch.Tensor]]:
    """The pixel inputs of rows' images (in row order) and each row's ``[k, 3]`` grid. Rows
    with the same bytes (a GRPO group) are decoded once."""
    from flowrl.data.images import pixel_inputs

    processor = image_processor_of(model)
    unique: dict[bytes, int] = {}
    for row in images_B:
        for blob in row or ():
            unique.setdefault(blob, len(unique))
    if not unique:
        return {}, [torch.zeros((0, 3), dtype=torch.long) for _ in images_B]
    blobs = list(unique)
    out = pixel_inputs([[b] for b in blobs], processor)
    patches = out["image_grid_thw"].prod(-1)
    starts = torch.cumsum(patches, 0) - patches
    order = [unique[b] for row in images_B for b in (row or ())]
    pixel_values = torch.cat([out["pixel_values"][int(starts[k]): int(starts[k] + patches[k])] for k in order])
    grids = out["image_grid_thw"][order] if order else out["image_grid_thw"][:0]
    per_row, at = [], 0
    for row in images_B:
        k = len(row or ())
        per_row.append(grids[at: at + k])
        at += k
    return {"pixel_values": pixel_values, "image_grid_thw": grids}, per_row


def text_positions(padded: Padded) -> torch.Tensor:
    """``[R, C]`` each slot's position in its own sequence: the layout's position ids (packed or
    shared-prompt lines), or the column (right-padded rows)."""
    if padded.position_ids_BL is not None:
        return padded.position_ids_BL.long()
    num_lines, width = padded.input_ids_BL.shape
    return torch.arange(width).expand(num_lines, -1)


def slot_rows(padded: Padded, mb: PackedBatch) -> torch.Tensor:
    """``[R, C]`` the batch row each slot belongs to (-1: padding). Response slots: from the flat
    order of the response tokens. Prompt slots: padded rows are their line's row; in lines, the
    first row among the responses of their sequence (a segment: a prompt and its rows' responses,
    starting where the position is 0), so a shared prompt belongs to its group's first row."""
    num_lines, width = padded.input_ids_BL.shape
    rows_T = torch.repeat_interleave(torch.arange(mb.num_rows), mb.response_cu_B1.diff().long())
    if padded.position_ids_BL is None:  # right-padded rows: line r is row r
        owner = torch.arange(num_lines)[:, None].expand(num_lines, width).clone()
        return owner.masked_fill(padded.attention_mask_BL.cpu() == 0, -1)
    owner = torch.full((num_lines, width), -1, dtype=torch.long)
    owner[padded.row_T, padded.pos_T] = rows_T
    segment = torch.cumsum((padded.position_ids_BL == 0).long(), dim=1)  # segment number within the line
    key = torch.arange(num_lines)[:, None] * (width + 1) + segment
    none = mb.num_rows + 1
    first = torch.full((num_lines * (width + 1),), none, dtype=torch.long)
    is_response = owner >= 0
    first.scatter_reduce_(0, key[is_response], owner[is_response], reduce="amin")
    prompt_owner = first[key]
    return torch.where(is_response, owner, prompt_owner.masked_fill(prompt_owner == none, -1))


TEXT_IDS = ("pad_token_id", "eos_token_id", "bos_token_id", "vocab_size", "hidden_size")


def with_text_ids(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its text config's token ids and sizes also on the top-level config (a VLM's
    loaded config keeps them in ``text_config`` only; the engines read ``config.pad_token_id``)."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else None
    if text is None or text is config:
        return model
    for key in TEXT_IDS:
        if getattr(config, key, None) is None and getattr(text, key, None) is not None:
            setattr(config, key, getattr(text, key))
    return model

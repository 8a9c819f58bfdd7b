"""Vision-language models (Qwen2-VL / Qwen2.5-VL) in flowrl's engines: what the ``hf`` decode loop
and the ``dp`` / FSDP2 trainers call when a batch has images.

* :func:`register_auto_classes` makes ``AutoModelForCausalLM`` load ``qwen2_vl`` /
  ``qwen2_5_vl`` checkpoints as their ``...ForConditionalGeneration`` (transformers 5 maps them to
  ``AutoModelForImageTextToText`` only), so every loader of the framework takes a VLM unchanged.
* :func:`mrope_positions` is a sequence's multimodal rotary positions (``[3, L]``: time, height,
  width; text tokens have three equal ones) from the model's own ``get_rope_index``, computed per
  sequence without padding, then placed into whatever layout the batch has: padded rows (with the
  attention mask), or packed lines (``[4, R, C]``: the per-sequence text positions first, from
  which transformers builds the block-causal mask, then the three rotary rows), so packing keeps
  every sequence's positions exactly.
* :func:`vlm_hidden` is the decoder's last hidden state for a :class:`~flowrl.data.packed.PackedBatch`
  with images: the rows' images decoded (:func:`flowrl.data.images.pixel_inputs`) in the order of
  their image tokens in the layout, through the vision tower (frozen or trained:
  ``actor.freeze_vision_tower``, :func:`freeze_vision_tower`) and scattered into the
  ``<|image_pad|>`` embeddings.
* :func:`decode_with_images` is the ``hf`` backend's decode loop for prompts with images: the
  prompts prefilled once with their pixels and rotary positions, each sample then continuing at
  its prompt's last position + 1 (``hf_decode``'s loop otherwise: finished rows leave the cache).

Shape letters: B rows, L padded length, R packed lines, C line capacity, H hidden, V vocabulary,
N = B * n samples, A rows still decoding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from flowrl.models.vlm_config import VLM_MODEL_TYPES, is_vlm_config, is_vlm_dir  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from flowrl.backends.interfaces import SamplingParams
    from flowrl.data.packed import PackedBatch, Padded

PROCESSOR_ATTR = "_flowrl_image_processor"


def register_auto_classes() -> None:
    """``AutoModelForCausalLM`` builds Qwen2-VL and Qwen2.5-VL (idempotent)."""
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


def _inner(model: torch.nn.Module) -> Any:
    """The ``Qwen2VLModel`` (vision tower + language model) of a ``...ForConditionalGeneration``."""
    return getattr(model, "model", model)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
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
    inner = _inner(_unwrap(model))
    token_types = (ids_1L == model.config.image_token_id).int()
    if prompt_len is not None:
        token_types[:, prompt_len:] = 0
    positions, _ = inner.get_rope_index(ids_1L, mm_token_type_ids=token_types, image_grid_thw=grid_thw.to(ids_L.device))
    return positions[:, 0].long()


def _image_inputs(model: torch.nn.Module, images_B: Sequence[Sequence[bytes]]) -> tuple[dict, list[torch.Tensor]]:
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


def vlm_hidden(model: torch.nn.Module, mb: PackedBatch, padded: Padded, device: torch.device,
               attn_implementation: str = "sdpa") -> torch.Tensor:
    """The last hidden state ``[B or R, L, H]`` of ``padded`` (``mb.model_inputs``: padded rows,
    packed lines or shared-prompt lines) with ``mb``'s images.

    Every slot's rotary position is its sequence's (:func:`mrope_positions` of the row's prompt
    and response, unpadded) at the slot's text position, the slot's row from :func:`slot_rows`.
    The images go to the model in the order of their prompts' first slots in the layout (each
    shared prompt once)."""
    from flowrl.backends.interfaces import block_attention_mask

    images_B = mb.images or [[] for _ in range(mb.num_rows)]
    ids = padded.input_ids_BL
    num_lines, width = ids.shape
    text_RC = text_positions(padded)
    owner_RC = slot_rows(padded, mb)
    # the images in the order of their sequences' first slots in the layout (row-major, as the model scatters)
    first_R, first_C = ((text_RC == 0) & (owner_RC >= 0)).nonzero(as_tuple=True)
    order = owner_RC[first_R, first_C].tolist()
    inputs, grid_seq = _image_inputs(model, [images_B[b] for b in order])
    grid_of = {tuple(images_B[b] or ()): grid_seq[i] for i, b in enumerate(order)}
    # each slot's rotary position: its row's sequence's (computed once per row) at its text position
    rows = sorted(set(owner_RC[owner_RC >= 0].tolist()))
    pieces, offset_B = [], torch.zeros(mb.num_rows, dtype=torch.long)
    at = 0
    for b in rows:
        p0, p1 = int(mb.prompt_cu_B1[b]), int(mb.prompt_cu_B1[b + 1])
        seq = torch.cat([mb.prompt_P[p0:p1], mb.response_T[int(mb.response_cu_B1[b]): int(mb.response_cu_B1[b + 1])]])
        grid = grid_of.get(tuple(images_B[b] or ()))
        pieces.append(mrope_positions(model, seq.long(), grid, p1 - p0))
        offset_B[b] = at
        at += seq.numel()
    pos_3RC = torch.ones((3, num_lines, width), dtype=torch.long)
    if pieces:
        real = owner_RC >= 0
        pos_3RC[:, real] = torch.cat(pieces, dim=1)[:, offset_B[owner_RC[real]] + text_RC[real].long()]
    inner = _inner(_unwrap(model))
    ids = ids.to(device)
    embeds = inner.get_input_embeddings()(ids)
    if inputs:  # image features into the prompts' <|image_pad|> slots (a response's are text)
        features = inner.get_image_features(inputs["pixel_values"].to(device), inputs["image_grid_thw"].to(device),
                                            return_dict=True).pooler_output
        features = torch.cat(list(features)).to(embeds.dtype)
        in_prompt = torch.ones(ids.shape, dtype=torch.bool)
        in_prompt[padded.row_T, padded.pos_T] = False
        slots = (ids == model.config.image_token_id) & in_prompt.to(device)
        if int(slots.sum()) != features.shape[0]:
            raise ValueError(f"{int(slots.sum())} image tokens in the prompts, {features.shape[0]} image features: "
                             "each <image> must be expanded to its image's tokens (flowrl.data.images)")
        embeds = embeds.masked_scatter(slots[..., None], features)
    kwargs: dict[str, Any] = {"inputs_embeds": embeds, "use_cache": False}
    if padded.block_mask_BLL is not None:  # shared prompts: the block mask
        kwargs["attention_mask"] = block_attention_mask(padded.block_mask_BLL, attn_implementation).to(device)
        kwargs["position_ids"] = pos_3RC.to(device)
    elif padded.position_ids_BL is not None:  # packed lines: text positions first (the block-causal mask)
        kwargs["position_ids"] = torch.cat([padded.position_ids_BL[None], pos_3RC]).to(device)
    else:
        kwargs["attention_mask"] = padded.attention_mask_BL.to(device)
        kwargs["position_ids"] = pos_3RC.to(device)
    return inner.language_model(**kwargs).last_hidden_state


# ----------------------------------------------------------------- generation
@torch.no_grad()
def decode_with_images(model: torch.nn.Module, prompts: list[list[int]], images: Sequence[Sequence[bytes]],
                       params: SamplingParams, *, eos_ids: set[int], pad_id: int,
                       device: torch.device | str = "cpu") -> tuple[list[list[int]], list[list[float]], Any]:
    """``hf_decode.decode`` for prompts with images (``images[i]``: prompt i's encoded images):
    the same sampling and results, with the pixels in the prefill and multimodal rotary positions."""
    from transformers import DynamicCache

    from flowrl.backends.generate.hf_decode import DecodeStats, _choose, _left_padded, _warpers

    n, max_new = params.n, params.max_new_tokens
    ids_BP, mask = _left_padded(prompts, pad_id)
    width = ids_BP.shape[1]
    inputs, grid_B = _image_inputs(model, images)
    pos_3BP = torch.ones((3, len(prompts), width), dtype=torch.long)
    next_B = torch.zeros(len(prompts), dtype=torch.long)
    for b, p in enumerate(prompts):
        pos = mrope_positions(model, torch.tensor(p, dtype=torch.long), grid_B[b])
        pos_3BP[:, b, width - len(p):] = pos
        next_B[b] = int(pos.max()) + 1
    ids_BP, mask = ids_BP.to(device), mask.to(device)
    stats = DecodeStats(slots=ids_BP.numel(), tokens=int(mask.sum()))
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    cache = DynamicCache(config=text_config)
    extra = {k: v.to(device) for k, v in inputs.items()}
    hidden = _inner(model)(input_ids=ids_BP, attention_mask=mask, position_ids=pos_3BP.to(device),
                           past_key_values=cache, use_cache=True, **extra).last_hidden_state[:, -1]
    logits_AV = model.get_output_embeddings()(hidden).float()
    next_A = next_B.to(device)
    if n > 1:
        logits_AV, mask, next_A = logits_AV.repeat_interleave(n, 0), mask.repeat_interleave(n, 0), next_A.repeat_interleave(n, 0)
        cache.batch_repeat_interleave(n)
    num_rows, vocab = logits_AV.shape
    warpers = [] if params.greedy else _warpers(params)
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
    live = torch.arange(num_rows, device=device)
    tokens_NL = torch.full((num_rows, max_new), pad_id, dtype=torch.long, device=device)
    logp_NL = torch.zeros((num_rows, max_new), device=device)
    lengths_N = torch.full((num_rows,), max_new, dtype=torch.long, device=device)
    for step in range(max_new):
        token_A = _choose(logits_AV, live, num_rows, vocab, warpers, params.greedy)
        scaled = logits_AV if params.greedy or params.temperature == 1.0 else logits_AV / params.temperature
        logp_NL[live, step] = torch.log_softmax(scaled, -1).gather(-1, token_A[:, None]).squeeze(-1)
        tokens_NL[live, step] = token_A
        done_A = torch.isin(token_A, eos)
        lengths_N[live[done_A]] = step + 1
        if step == max_new - 1 or bool(done_A.all()):
            break
        if bool(done_A.any()):
            keep = (~done_A).nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            live, mask, token_A, next_A = live[keep], mask[keep], token_A[keep], next_A[keep]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        stats.slots += live.numel()
        stats.tokens += live.numel()
        position_3A1 = (next_A + step)[None, :, None].expand(3, -1, 1)
        hidden = _inner(model)(input_ids=token_A[:, None], attention_mask=mask, position_ids=position_3A1,
                               past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
        logits_AV = model.get_output_embeddings()(hidden).float()
    stats.response_tokens = int(lengths_N.sum())
    tokens_NL, logp_NL, lengths = tokens_NL.cpu(), logp_NL.cpu(), lengths_N.tolist()
    responses = [row[:k].tolist() for row, k in zip(tokens_NL, lengths)]
    logprobs = [row[:k].tolist() for row, k in zip(logp_NL, lengths)]
    return responses, logprobs, stats


def generate_with_images(generator: Any, prompts: list[list[int]], images: Sequence[Sequence[bytes]],
                         params: SamplingParams, micro_batch_size: int) -> tuple[list[list[int]], list[list[float]]]:
    """``HFGenerator.generate`` for prompts with images: :func:`decode_with_images` over chunks of
    ``micro_batch_size // n`` prompts (the caller has seeded torch); stats in ``last_stats``."""
    from flowrl.backends.generate.hf_decode import DecodeStats
    from flowrl.backends.train.precision import autocast

    responses: list[list[int]] = []
    logprobs: list[list[float]] = []
    generator.last_stats = DecodeStats()
    per_call = max(1, micro_batch_size // params.n)
    for start in range(0, len(prompts), per_call):
        with autocast(generator.device, generator.precision):
            r, lp, stats = decode_with_images(generator.model, prompts[start:start + per_call],
                                              images[start:start + per_call], params, eos_ids=generator.eos_ids,
                                              pad_id=generator.pad_id, device=generator.device)
        responses += r
        logprobs += lp
        generator.last_stats.add(stats)
    return responses, logprobs


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

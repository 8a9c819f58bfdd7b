"""Vision-language models (Qwen2-VL / Qwen2.5-VL) in flowrl's engines: the trainers' forward and
the ``hf`` backend's decode loop when a batch has images (the model-level pieces they use, rotary
positions, the image inputs, the slot layout, are :mod:`flowrl.models.vlm`).

* :func:`vlm_hidden` is the decoder's last hidden state for a :class:`~flowrl.data.packed.PackedBatch`
  with images: the rows' images decoded (:func:`flowrl.data.images.pixel_inputs`) in the order of
  their image tokens in the layout, through the vision tower (frozen or trained:
  ``actor.freeze_vision_tower``, :func:`flowrl.models.vlm.freeze_vision_tower`) and scattered into
  the ``<|image_pad|>`` embeddings.
* :func:`decode_with_images` is the ``hf`` backend's decode loop for prompts with images: the
  prompts prefilled once with their pixels and rotary positions, each sample then continuing at
  its prompt's last position + 1 (``hf_decode``'s loop otherwise: finished rows leave the cache).

The model-level functions are called through the module (``vlm.mrope_positions``), so a test that
replaces one there replaces it here too.

Shape letters: B rows, L padded length, R packed lines, C line capacity, H hidden, V vocabulary,
N = B * n samples, A rows still decoding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from flowrl.models import vlm

if TYPE_CHECKING:
    from flowrl.backends.interfaces import SamplingParams
    from flowrl.data.packed import PackedBatch, Padded


def vlm_hidden(model: torch.nn.Module, mb: PackedBatch, padded: Padded, device: torch.device,
               attn_implementation: str = "sdpa") -> torch.Tensor:
    """The last hidden state ``[B or R, L, H]`` of ``padded`` (``mb.model_inputs``: padded rows,
    packed lines or shared-prompt lines) with ``mb``'s images.

    Every slot's rotary position is its sequence's (:func:`flowrl.models.vlm.mrope_positions` of the row's prompt
    and response, unpadded) at the slot's text position, the slot's row from :func:`flowrl.models.vlm.slot_rows`.
    The images go to the model in the order of their prompts' first slots in the layout (each
    shared prompt once)."""
    from flowrl.backends.interfaces import block_attention_mask

    images_B = mb.images or [[] for _ in range(mb.num_rows)]
    ids = padded.input_ids_BL
    num_lines, width = ids.shape
    text_RC = vlm.text_positions(padded)
    owner_RC = vlm.slot_rows(padded, mb)
    # the images in the order of their sequences' first slots in the layout (row-major, as the model scatters)
    first_R, first_C = ((text_RC == 0) & (owner_RC >= 0)).nonzero(as_tuple=True)
    order = owner_RC[first_R, first_C].tolist()
    inputs, grid_seq = vlm.image_inputs(model, [images_B[b] for b in order])
    grid_of = {tuple(images_B[b] or ()): grid_seq[i] for i, b in enumerate(order)}
    # each slot's rotary position: its row's sequence's (computed once per row) at its text position
    rows = sorted(set(owner_RC[owner_RC >= 0].tolist()))
    pieces, offset_B = [], torch.zeros(mb.num_rows, dtype=torch.long)
    at = 0
    for b in rows:
        p0, p1 = int(mb.prompt_cu_B1[b]), int(mb.prompt_cu_B1[b + 1])
        seq = torch.cat([mb.prompt_P[p0:p1], mb.response_T[int(mb.response_cu_B1[b]): int(mb.response_cu_B1[b + 1])]])
        grid = grid_of.get(tuple(images_B[b] or ()))
        pieces.append(vlm.mrope_positions(model, seq.long(), grid, p1 - p0))
        offset_B[b] = at
        at += seq.numel()
    pos_3RC = torch.ones((3, num_lines, width), dtype=torch.long)
    if pieces:
        real = owner_RC >= 0
        pos_3RC[:, real] = torch.cat(pieces, dim=1)[:, offset_B[owner_RC[real]] + text_RC[real].long()]
    inner = vlm.inner_model(vlm.unwrap_peft(model))
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
def _prefill(model: torch.nn.Module, prompts: list[list[int]], images: Sequence[Sequence[bytes]], *, pad_id: int,
             device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any, Any]:
    """The prompts (left-padded) prefilled once with their pixels and multimodal rotary positions:
    ``(logits_BV at each prompt's last token, attention mask, next_B: each prompt's last position + 1,
    the KV cache, DecodeStats of the prefill)``."""
    from transformers import DynamicCache

    from flowrl.backends.generate.hf_decode import DecodeStats, _left_padded

    ids_BP, mask = _left_padded(prompts, pad_id)
    width = ids_BP.shape[1]
    inputs, grid_B = vlm.image_inputs(model, images)
    pos_3BP = torch.ones((3, len(prompts), width), dtype=torch.long)
    next_B = torch.zeros(len(prompts), dtype=torch.long)
    for b, p in enumerate(prompts):
        pos = vlm.mrope_positions(model, torch.tensor(p, dtype=torch.long), grid_B[b])
        pos_3BP[:, b, width - len(p):] = pos
        next_B[b] = int(pos.max()) + 1
    ids_BP, mask = ids_BP.to(device), mask.to(device)
    stats = DecodeStats(slots=ids_BP.numel(), tokens=int(mask.sum()))
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    cache = DynamicCache(config=text_config)
    extra = {k: v.to(device) for k, v in inputs.items()}
    hidden = vlm.inner_model(model)(input_ids=ids_BP, attention_mask=mask, position_ids=pos_3BP.to(device),
                                    past_key_values=cache, use_cache=True, **extra).last_hidden_state[:, -1]
    return model.get_output_embeddings()(hidden).float(), mask, next_B, cache, stats


@torch.no_grad()
def decode_with_images(model: torch.nn.Module, prompts: list[list[int]], images: Sequence[Sequence[bytes]],
                       params: SamplingParams, *, eos_ids: set[int], pad_id: int,
                       device: torch.device | str = "cpu") -> tuple[list[list[int]], list[list[float]], Any]:
    """``hf_decode.decode`` for prompts with images (``images[i]``: prompt i's encoded images):
    the same sampling and results, with the pixels in the prefill and multimodal rotary positions."""
    from flowrl.backends.generate.hf_decode import _to_host, sample

    logits_BV, mask, next_B, cache, stats = _prefill(model, prompts, images, pad_id=pad_id, device=device)

    def feed(token_A: torch.Tensor, mask: torch.Tensor, live: torch.Tensor, step: int,
             next_A: torch.Tensor) -> torch.Tensor:  # text tokens after the images: one position on every axis
        position_3A1 = (next_A + step)[None, :, None].expand(3, -1, 1)
        hidden = vlm.inner_model(model)(input_ids=token_A[:, None], attention_mask=mask, position_ids=position_3A1,
                                        past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
        return model.get_output_embeddings()(hidden).float()

    tokens_NL, logp_NL, lengths_N = sample(logits_BV, mask, cache, params, feed, eos_ids=eos_ids, pad_id=pad_id,
                                           device=device, stats=stats, carry=(next_B.to(device),))
    responses, logprobs, _ = _to_host(tokens_NL, logp_NL, lengths_N)
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

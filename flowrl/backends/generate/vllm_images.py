"""Prompts with images on the ``vllm`` backend (a Qwen2-VL / Qwen2.5-VL ``model.path``): the
requests that carry them, the engine settings a VLM needs, and the check that vLLM placed the image
tokens exactly where flowrl's prompt has them.

flowrl's ``prompt_ids`` hold each image already expanded, as Qwen2-VL's processor writes it
(``<|vision_start|>`` + k x ``<|image_pad|>`` + ``<|vision_end|>``, k from the image's size:
:func:`flowrl.data.images.image_token_count`), and every token budget counts those k. vLLM 0.32
does not recognise an expanded token prompt: a ``TokensPrompt`` with ``multi_modal_data`` goes to
the model's multimodal processor as it is (``vllm/renderers/base.py`` 936-955 ``_process_tokens``
-> 894-934 ``_process_multimodal`` -> ``mm_processor.apply``), whose ``apply``
(``vllm/multimodal/processing/processor.py`` 1811-1845) always applies the prompt updates to the
ids (``_apply_hf_processor`` 1462-1495 keeps ``inputs.prompt`` unchanged;
``_maybe_apply_prompt_updates`` 1793-1809; ``_apply_prompt_updates`` 1699-1735), and Qwen2-VL's
update replaces ONE ``<|image_pad|>`` by the image's k (``vllm/model_executor/models/qwen2_vl.py``
1236-1268: ``PromptReplacement(target=[placeholder], replacement=[placeholder] * num_tokens)``),
matched at the next pad after the previous item's match with no test of whether the run is
already expanded (``_apply_token_matches_with_placeholders`` 851-900, ``iter_token_matches``
512-549). Measured with those functions in the vLLM CPU environment: a prompt with runs of 4 and 3
pads grows from 14 to 19 ids and the second image's placeholder starts inside the first run; the
same prompt with one pad per image comes back as the 14 expanded ids
(``tests/vllm_env/check_mm_placeholders.py``).

So each run of ``<|image_pad|>`` in a prompt goes to vLLM as one token (:func:`collapse_image_pads`),
vLLM expands it again from the image, which it resizes with the same ``preprocessor_config.json``,
and :func:`check_expanded` compares vLLM's prompt (``RequestOutput.prompt_token_ids``) with
flowrl's, id for id: another count (another resize) is an error, never silently shifted positions
or log-probs. A response's ``<|image_pad|>`` (the policy may sample one) is text and stays.

Images arrive per prompt as encoded bytes (the ``images`` column, ``flowrl.data.images``) and go
to vLLM as RGB PIL images (``multi_modal_data={"image": [...]}``), in the prompt's order, each
distinct image decoded once per call (a GRPO group's ``n`` requests share the objects).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

__all__ = ["MAX_IMAGES_PER_PROMPT", "check_expanded", "collapse_image_pads", "forget_image_features", "image_logprobs",
           "image_pad_id", "image_requests", "vlm_engine_kwargs"]

MAX_IMAGES_PER_PROMPT = 8
"""vLLM's ``limit_mm_per_prompt`` for images (its memory profile plans for that many per prompt);
a prompt with more is refused before the engine sees it."""


@lru_cache(maxsize=8)
def image_pad_id(model_dir: str | None) -> int | None:
    """The ``<|image_pad|>`` id of a VLM's ``config.json`` (``image_token_id``); None for a text model
    or no directory."""
    from flowrl.models.vlm_config import is_vlm_config

    if model_dir is None:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return int(config["image_token_id"]) if is_vlm_config(config) and "image_token_id" in config else None


def vlm_engine_kwargs(model_dir: str) -> dict[str, Any]:
    """``vllm.LLM`` settings for a VLM (none for a text model): the tokenizer is loaded (vLLM's
    multimodal processor refuses ``skip_tokenizer_init``: ``processor.py`` 1047-1052), at most
    :data:`MAX_IMAGES_PER_PROMPT` images and no video per prompt, and the weights come from the
    directory through vLLM's own loader (``load_format="auto"``), not a ``dummy`` start: vLLM 0.32
    folds the image processor's normalisation into the vision tower as parameters computed at
    build time (``FusedMMInputNorm``: ``rescale / std`` and ``-mean / std``, in no checkpoint), which
    the dummy loader overwrites with random values that no weight sync restores (measured on the
    CPU build: vision features off by 0.24, log-probs by 0.14, greedy tokens the same)."""
    if image_pad_id(model_dir) is None:
        return {}
    return {"skip_tokenizer_init": False, "limit_mm_per_prompt": {"image": MAX_IMAGES_PER_PROMPT, "video": 0},
            "load_format": "auto"}


def forget_image_features(llm: Any, model_dir: str | None) -> None:
    """After a weight or adapter load into a VLM's engine: drop the image features vLLM cached
    under the old vision tower (the scheduler's encoder cache and the runner's; keeping the
    runner's alone gives "Encoder cache miss" on the next image, measured on the CPU build)."""
    if image_pad_id(model_dir) is not None:
        llm.llm_engine.reset_encoder_cache()


def collapse_image_pads(prompt: Sequence[int], pad_id: int) -> list[int]:
    """``prompt`` with each run of ``pad_id`` written once (what vLLM's Qwen2-VL processor expands)."""
    out: list[int] = []
    for tok in prompt:
        if tok != pad_id or not out or out[-1] != pad_id:
            out.append(int(tok))
    return out


def _has_images(images: Sequence[Sequence[bytes] | None] | None) -> bool:
    return images is not None and any(images)


def image_requests(prompts: Sequence[Sequence[int]], images: Sequence[Sequence[bytes] | None] | None, *, n: int,
                   pad_id: int | None) -> list[dict]:
    """vLLM ``TokensPrompt``s, ``n`` per prompt (prompt-major): with images, the prompt's pad runs
    collapsed and its images as PIL images in order; without, the ids as they are."""
    from vllm.inputs import TokensPrompt

    if not _has_images(images):
        return [TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(n)]
    if pad_id is None:
        raise ValueError("prompts with images on the vllm backend need a vision-language model.path "
                         "(config.json with image_token_id); fix: a Qwen2-VL / Qwen2.5-VL model or prompts without images")
    if len(images) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(images)} rows of images")
    decoded: dict[bytes, Any] = {}
    requests = []
    for i, (prompt, row) in enumerate(zip(prompts, images)):
        row = list(row or ())
        if len(row) > MAX_IMAGES_PER_PROMPT:
            raise ValueError(f"prompt {i} has {len(row)} images; the vllm backend takes at most "
                             f"{MAX_IMAGES_PER_PROMPT} (flowrl.backends.generate.vllm_images.MAX_IMAGES_PER_PROMPT)")
        request = TokensPrompt(prompt_token_ids=collapse_image_pads(prompt, pad_id) if row else list(prompt))
        if row:
            request["multi_modal_data"] = {"image": [_decoded(blob, decoded) for blob in row]}
        requests += [TokensPrompt(**request) for _ in range(n)]  # one dict each, the images shared
    return requests


def _decoded(blob: bytes, seen: dict[bytes, Any]) -> Any:
    from flowrl.data.images import decode_image

    if blob not in seen:
        seen[blob] = decode_image(blob)
    return seen[blob]


def check_expanded(outputs: Sequence[Any], prompts: Sequence[Sequence[int]],
                   images: Sequence[Sequence[bytes] | None] | None, *, n: int = 1) -> None:
    """RuntimeError unless each output's ``prompt_token_ids`` (vLLM's prompt after its image
    expansion) equals its request's ids in flowrl (``prompts``, each ``n`` times); nothing to
    check without images."""
    if not _has_images(images):
        return
    expected = [ids for ids in prompts for _ in range(n)]
    for i, (out, ids) in enumerate(zip(outputs, expected, strict=True)):
        got = list(out.prompt_token_ids)
        if got != list(ids):
            raise RuntimeError(f"request {i}: vLLM's prompt after its image expansion has {len(got)} tokens, "
                               f"flowrl's {len(ids)} (or other ids): vLLM resized an image to another size than "
                               "flowrl.data.images counted; both read preprocessor_config.json (min_pixels, "
                               "max_pixels, patch_size, merge_size)")


def image_logprobs(llm: Any, prompts: list[list[int]], responses: list[list[int]],
                   images: Sequence[Sequence[bytes] | None] | None, *, pad_id: int | None, temperature: float = 1.0,
                   lora_request: Any = None) -> list[list[float]]:
    """Teacher-forced log-probs of each response after its prompt and images: vLLM's prompt
    log-probs of ``prompt + response`` (the prompt's pad runs collapsed, the response as it is),
    read at flowrl's positions once vLLM's expanded prompt is checked equal to flowrl's. Without
    images: :func:`flowrl.backends.generate.vllm_logprobs.teacher_forced_logprobs`."""
    from flowrl.backends.generate.vllm_logprobs import prompt_logprob_params, read_logprobs, teacher_forced_logprobs

    if not _has_images(images):
        return teacher_forced_logprobs(llm, prompts, responses, temperature=temperature, lora_request=lora_request)
    requests = image_requests(prompts, images, n=1, pad_id=pad_id)
    for request, response in zip(requests, responses, strict=True):
        request["prompt_token_ids"] = request["prompt_token_ids"] + list(response)
    outputs = llm.generate(requests, [prompt_logprob_params(temperature)] * len(requests), use_tqdm=False,
                           lora_request=lora_request)
    check_expanded(outputs, [list(p) + list(r) for p, r in zip(prompts, responses)], images)
    return read_logprobs(prompts, responses, outputs, temperature)

"""vLLM's own placeholder handling for a Qwen2-VL token prompt, without an engine (the engine's run:
``check_vlm.py``). vLLM applies the model's
prompt update to every token prompt with images (``processor.py`` ``_apply_prompt_updates``), and
Qwen2-VL's update replaces one ``<|image_pad|>`` by the image's k tokens (``qwen2_vl.py``
``_get_prompt_updates``). So a prompt sent with one pad per image comes back exactly as flowrl's
expanded prompt (``flowrl.backends.generate.vllm_images``), and an already-expanded prompt would
not: it grows and the second image's placeholder starts inside the first run. Runs in the vLLM
environment (``test_vllm_env.py``); a few seconds."""

from vllm.multimodal.processing.processor import PromptReplacement, _apply_token_matches_with_placeholders

from flowrl.backends.generate.vllm_images import collapse_image_pads

VS, PAD, VE = 8, 9, 10
COUNTS = [4, 3]  # two images of 4 and 3 tokens
EXPANDED = [1, VS] + [PAD] * 4 + [VE, 2, VS] + [PAD] * 3 + [VE, 3]  # flowrl's prompt_ids


def _updates(counts):
    """Qwen2-VL's update per image, as ``_get_prompt_updates`` builds it, resolved per item."""
    return {"image": [[PromptReplacement(modality="image", target=[PAD], replacement=[PAD] * k).resolve(i)]
                      for i, k in enumerate(counts)]}


def test_one_pad_per_image_expands_to_flowrls_prompt():
    ids, _, placeholders = _apply_token_matches_with_placeholders(collapse_image_pads(EXPANDED, PAD), _updates(COUNTS))
    assert ids == EXPANDED
    assert [(p.start_idx, len(p.tokens)) for p in placeholders["image"]] == [(2, 4), (9, 3)]


def test_an_expanded_prompt_is_expanded_again():
    ids, _, placeholders = _apply_token_matches_with_placeholders(EXPANDED, _updates(COUNTS))
    assert len(ids) == len(EXPANDED) + sum(k - 1 for k in COUNTS)  # 14 -> 19
    assert [(p.start_idx, len(p.tokens)) for p in placeholders["image"]] == [(2, 4), (6, 3)]  # inside run 1

"""A tiny Qwen2-VL built from config, with a character tokenizer and the model's image processor,
for the embedded vision-language task and tests.

It is an ordinary ``Qwen2VLForConditionalGeneration`` (transformers' own vision tower, merger,
multimodal rotary positions) in fp32, so every code path is the one real Qwen2-VL checkpoints
take; only the sizes are small: a one-block vision tower of width 32 on 8-pixel patches (a 64 x 64
image is 8 x 8 patches, merged 2 x 2 into 16 image tokens) and the default tiny text model's
decoder (hidden 64, 2 layers, 8 heads of 8 channels: ``mrope_section`` [2, 1, 1] splits each head's
4 rotary frequencies over time, height and width).

The tokenizer is :func:`flowrl.models.char_tokenizer.build_char_tokenizer` plus Qwen2-VL's vision
special tokens (``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``, ``<|video_pad|>``);
the image processor is ``Qwen2VLImageProcessor`` with the model's patch, merge and pixel bounds.
``save_tiny_vlm(dir)`` writes all three, loadable with ``from_pretrained`` without any hub access.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowrl.data.images import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START, VISION_TOKENS  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

VLM_ARCHITECTURES = ("qwen2_vl", "qwen2_5_vl")

TINY_VLM_PRESETS: dict[str, dict[str, Any]] = {
    # ~0.15M parameters; a 64 x 64 image is 16 image tokens.
    "default": dict(hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=4, intermediate_size=256,
                    vision_depth=1, vision_embed_dim=32, vision_heads=2, patch_size=8, merge_size=2,
                    image_size=64, mrope_section=(2, 1, 1)),
}


def build_vlm_tokenizer() -> PreTrainedTokenizerBase:
    """The character tokenizer with Qwen2-VL's vision special tokens (one id each)."""
    from flowrl.models.char_tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens(list(VISION_TOKENS), special_tokens=True)
    return tokenizer


def build_image_processor(*, patch_size: int = 8, merge_size: int = 2, image_size: int = 64) -> Any:
    """Qwen2-VL's image processor for images of about ``image_size`` squared pixels (resized to a
    multiple of ``patch_size * merge_size`` within those pixel bounds)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    pixels = image_size * image_size
    return Qwen2VLImageProcessorPil(patch_size=patch_size, merge_size=merge_size, temporal_patch_size=2,
                                    min_pixels=pixels, max_pixels=pixels,
                                    size={"shortest_edge": pixels, "longest_edge": pixels})


def build_tiny_vlm(tokenizer: PreTrainedTokenizerBase, *, hidden_size: int = 64, num_layers: int = 2,
                   num_heads: int = 8, num_kv_heads: int = 4, intermediate_size: int = 256, vision_depth: int = 1,
                   vision_embed_dim: int = 32, vision_heads: int = 2, patch_size: int = 8, merge_size: int = 2,
                   image_size: int = 64, mrope_section: tuple[int, int, int] = (2, 1, 1),
                   max_position_embeddings: int = 256, arch: str = "qwen2_vl", seed: int = 0) -> PreTrainedModel:
    """A randomly initialised fp32 ``Qwen2VLForConditionalGeneration`` for ``tokenizer`` (which must
    hold the vision tokens: :func:`build_vlm_tokenizer`); ``arch``: ``qwen2_vl`` or ``qwen2_5_vl``
    (Qwen2.5-VL's windowed vision tower: the last block full attention). ``image_size`` is not part
    of the model (the image processor's); it is accepted so a preset is one dict."""
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )

    del image_size
    if arch not in VLM_ARCHITECTURES:
        raise ValueError(f"arch={arch!r} is not a tiny VLM architecture; use one of {', '.join(VLM_ARCHITECTURES)}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(f"hidden_size={hidden_size}, num_heads={num_heads}, num_kv_heads={num_kv_heads}: heads "
                         "must divide hidden_size and kv heads must divide heads")
    if sum(mrope_section) * 2 != hidden_size // num_heads:
        raise ValueError(f"mrope_section={list(mrope_section)} must sum to head_dim / 2 = "
                         f"{hidden_size // num_heads // 2}")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    if any(i is None or i == tokenizer.unk_token_id for i in ids.values()):
        raise ValueError(f"the tokenizer lacks Qwen2-VL's vision tokens ({', '.join(VISION_TOKENS)}); "
                         "build it with flowrl.models.tiny_vlm.build_vlm_tokenizer()")
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(mrope_section)},
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id)
    vision = dict(depth=vision_depth, embed_dim=vision_embed_dim, num_heads=vision_heads, mlp_ratio=2,
                  hidden_size=hidden_size, patch_size=patch_size, spatial_merge_size=merge_size,
                  temporal_patch_size=2, in_channels=3)
    config_cls, model_cls = Qwen2VLConfig, Qwen2VLForConditionalGeneration
    if arch == "qwen2_5_vl":
        config_cls, model_cls = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        vision = dict(depth=vision_depth, hidden_size=vision_embed_dim, out_hidden_size=hidden_size,
                      intermediate_size=2 * vision_embed_dim, num_heads=vision_heads, patch_size=patch_size,
                      spatial_merge_size=merge_size, temporal_patch_size=2, window_size=2 * patch_size * merge_size,
                      fullatt_block_indexes=[vision_depth - 1], in_channels=3)
    config = config_cls(text_config=text, vision_config=vision, image_token_id=ids[IMAGE_PAD],
                           video_token_id=ids[VIDEO_PAD], vision_start_token_id=ids[VISION_START],
                           vision_end_token_id=ids[VISION_END], tie_word_embeddings=True, dtype="float32")
    for key in ("pad_token_id", "eos_token_id", "bos_token_id", "hidden_size", "vocab_size"):  # as Qwen2-VL's
        setattr(config, key, text[key])  # hub configs have them at the top level too (engines read them there)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model = model.to(torch.float32)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(tokenizer, key))
    return model


def tiny_vlm_preset(name: str) -> dict[str, Any]:
    if name not in TINY_VLM_PRESETS:
        raise ValueError(f"unknown tiny VLM preset {name!r}; valid: {', '.join(sorted(TINY_VLM_PRESETS))}")
    return dict(TINY_VLM_PRESETS[name])


def save_tiny_vlm(directory: str | Path, *, preset: str = "default", arch: str = "qwen2_vl", seed: int = 0) -> Path:
    """Build the tiny VLM of ``preset`` and write model, tokenizer and image processor to
    ``directory`` (a transformers directory)."""
    kwargs = tiny_vlm_preset(preset)
    tokenizer = build_vlm_tokenizer()
    model = build_tiny_vlm(tokenizer, **kwargs, arch=arch, seed=seed)
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    build_image_processor(patch_size=kwargs["patch_size"], merge_size=kwargs["merge_size"],
                          image_size=kwargs["image_size"]).save_pretrained(directory)
    return directory

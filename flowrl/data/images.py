"""Prompt images: verl's ``images`` column read, checked and turned into a model's inputs.

verl's multimodal Parquet (``examples/data_preprocess/geo3k.py``) has a ``prompt`` of chat
messages whose text holds one ``<image>`` placeholder per image, and an ``images`` column: a list
per row of ``{"bytes": ..., "path": ...}`` structs (``datasets.Image`` as Parquet), bytes set, or
a path and no bytes. Here:

* :func:`image_bytes` gives an entry's encoded bytes (read from ``path`` when there are none);
* :func:`check_image` opens the header and verifies the file (PIL's ``verify``: chunk checksums,
  no pixel decoding) and raises ValueError for an unreadable file, a mode that is not a colour
  or grey image (``ACCEPTED_MODES``) or more than ``max_pixels`` pixels; the prompt loader turns
  that into a rejected row (``rejected_prompts.jsonl``, with file and row);
* :func:`image_token_count` is how many ``<|image_pad|>`` tokens an image of that size becomes
  (Qwen2-VL's resize to a multiple of patch x merge, then one token per merge x merge patches),
  from the header's size alone, so the prompt's tokens (and every token budget and length that
  counts them) are known on the driver without decoding a pixel;
* :func:`expand_placeholders` writes each ``<image>`` as ``<|vision_start|>`` + n x
  ``<|image_pad|>`` + ``<|vision_end|>``, as Qwen2-VL's processor does;
* :func:`pixel_inputs` decodes the bytes (on the worker that runs the model) into
  ``pixel_values`` and ``image_grid_thw``.

The encoded bytes travel in the experience table as an Arrow ``list<binary>`` column
(:data:`IMAGES_TYPE`), repeated per sample like the other prompt columns.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

PLACEHOLDER = "<image>"
VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD)
"""Qwen2-VL's vision tokens (the tokenizer of :mod:`flowrl.models.tiny_vlm` adds them too)."""
IMAGES_COLUMN = "images"
IMAGES_TYPE = pa.list_(pa.binary())
ACCEPTED_MODES = ("RGB", "RGBA", "L", "LA", "P")
"""PIL modes taken (converted to RGB for the model); others (``1``, ``I;16``, ``F``, ``CMYK``...)
are rejected: their conversion to colour is not what the picture shows."""
MAX_PIXELS = 4096 * 4096
"""Default bound on an image's width x height (a larger one is rejected, not resized)."""


def image_bytes(entry: Any, *, base_dir: str | Path | None = None) -> bytes:
    """The encoded bytes of one ``images`` entry: a ``{"bytes", "path"}`` struct (verl's), raw
    bytes, or a path (relative ones under ``base_dir``)."""
    if isinstance(entry, (bytes, bytearray, memoryview)):
        return bytes(entry)
    path = entry
    if isinstance(entry, dict):
        if entry.get("bytes"):
            return bytes(entry["bytes"])
        path = entry.get("path")
    if not isinstance(path, str) or not path:
        raise ValueError(f"image entry {_short(entry)} has neither bytes nor a path")
    file = Path(path)
    if not file.is_absolute() and base_dir is not None:
        file = Path(base_dir) / file
    try:
        return file.read_bytes()
    except OSError as exc:
        raise ValueError(f"image path {path!r} cannot be read ({type(exc).__name__}: {exc.strerror or exc})") from None


def _short(entry: Any) -> str:
    text = repr(entry)
    return text if len(text) <= 60 else text[:57] + "..."


def check_image(data: bytes, *, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """``(width, height)`` of an encoded image; ValueError if it is unreadable, of a mode outside
    :data:`ACCEPTED_MODES`, or larger than ``max_pixels``."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            size, mode, fmt = img.size, img.mode, img.format
            img.verify()
    except UnidentifiedImageError:
        raise ValueError(f"image is unreadable ({len(data)} bytes in no format PIL reads)") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"image is unreadable ({len(data)} bytes; {type(exc).__name__}: {exc})") from None
    if mode not in ACCEPTED_MODES:
        raise ValueError(f"image ({fmt}) has mode {mode!r}; only {', '.join(ACCEPTED_MODES)} images are taken "
                         "(convert it to RGB)")
    width, height = size
    if width * height > max_pixels:
        raise ValueError(f"image is {width}x{height} = {width * height} pixels > {max_pixels}; resize it")
    if min(width, height) < 1:
        raise ValueError(f"image is {width}x{height}: empty")
    return width, height


def processor_geometry(processor: Any) -> tuple[int, int, int, int]:
    """``(patch_size, merge_size, min_pixels, max_pixels)`` of a Qwen2-VL image processor."""
    size = getattr(processor, "size", None) or {}
    min_pixels = getattr(processor, "min_pixels", None) or size.get("shortest_edge") or 56 * 56
    max_pixels = getattr(processor, "max_pixels", None) or size.get("longest_edge") or 28 * 28 * 1280
    return int(processor.patch_size), int(processor.merge_size), int(min_pixels), int(max_pixels)


def image_token_count(width: int, height: int, processor: Any) -> int:
    """``<|image_pad|>`` tokens of a ``width`` x ``height`` image after ``processor``'s resize."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    patch, merge, min_pixels, max_pixels = processor_geometry(processor)
    h, w = smart_resize(height, width, factor=patch * merge, min_pixels=min_pixels, max_pixels=max_pixels)
    return (h // patch) * (w // patch) // (merge * merge)


def expand_placeholders(text: str, counts: Sequence[int]) -> str:
    """``text`` with its i-th ``<image>`` as ``<|vision_start|>`` + ``counts[i]`` x
    ``<|image_pad|>`` + ``<|vision_end|>``; ValueError when the placeholders and images differ."""
    parts = text.split(PLACEHOLDER)
    if len(parts) - 1 != len(counts):
        raise ValueError(f"prompt has {len(parts) - 1} {PLACEHOLDER} placeholders but the row has {len(counts)} "
                         f"images; write one {PLACEHOLDER} per image")
    out = [parts[0]]
    for count, part in zip(counts, parts[1:]):
        out += [VISION_START, IMAGE_PAD * count, VISION_END, part]
    return "".join(out)


def decode_image(data: bytes) -> Any:
    """The RGB PIL image of encoded bytes."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img.load()
        return img.convert("RGB")


def pixel_inputs(images_per_row: Sequence[Sequence[bytes]], processor: Any) -> dict[str, Any]:
    """``pixel_values`` and ``image_grid_thw`` of every row's images in order (the model scatters
    them into the ``<|image_pad|>`` tokens in that order); empty dict when there are none."""
    flat = [decode_image(b) for row in images_per_row for b in (row or ())]
    if not flat:
        return {}
    out = processor(images=flat, return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def load_image_processor(model_dir: str | Path) -> Any:
    """The image processor saved with a model (``preprocessor_config.json``), or None."""
    if not model_dir or not (Path(model_dir) / "preprocessor_config.json").is_file():
        return None
    import logging

    from transformers import AutoImageProcessor

    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "requires torchvision ... falling back to the PIL backend"
    try:
        return AutoImageProcessor.from_pretrained(str(model_dir))
    finally:
        quiet.setLevel(level)


THUMBNAIL_PIXELS = 64


def thumbnail_html(images: Sequence[bytes] | None, *, size: int = THUMBNAIL_PIXELS) -> str:
    """``<img>`` tags (PNG data URIs, at most ``size`` pixels a side) of a row's encoded images,
    for the dashboard's samples view; empty for none, a marked placeholder for an unreadable one."""
    import base64

    from PIL import Image

    tags = []
    for data in images or ():
        try:
            with Image.open(io.BytesIO(data)) as img:
                img.load()
                small = img.convert("RGB")
            small.thumbnail((size, size))
            out = io.BytesIO()
            small.save(out, format="PNG")
            uri = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")
            tags.append(f'<img class="prompt-image" src="{uri}" width="{small.width}" height="{small.height}" '
                        f'style="margin:1px;border:1px solid #ccc">')
        except Exception:  # noqa: BLE001 - a bad image must not break the page
            tags.append('<span class="prompt-image-bad" title="unreadable image">[image]</span>')
    return "".join(tags)


def collapse_image_tokens(text: str) -> str:
    """``text`` with each run of ``<|image_pad|>`` written once with its count (``<|image_pad|>x16``)."""
    import re

    return re.sub(r"(?:<\|image_pad\|>)+", lambda m: f"<|image_pad|>x{m.group(0).count('<|image_pad|>')}", text)

"""Prompt datasets in verl's Parquet format, tokenized once, served in deterministic batches.

Columns read: ``prompt`` (chat messages, or a plain string), ``data_source``,
``reward_model.ground_truth`` and optionally ``extra_info``. Rows that cannot be used are reported
with their file, row and reason -- logged, kept in :attr:`PromptDataset.rejected` and written by
the trainer to ``rejected_prompts.jsonl`` -- never dropped silently: a missing or empty ground
truth, one that is a list, a mapping or a non-finite number, a message without text content (null),
a prompt with characters its tokens do not carry (outside the vocabulary: dropped, or mapped to
the unknown token), no ``data_source``, and a prompt longer than ``max_prompt_length`` tokens, which is left out
(``filter_overlong``) or cut as verl's ``data.truncation`` says (``left`` keeps the end, ``right``
the start, ``middle`` both halves; ``error`` fails).

Multimodal rows (verl's geo3k format: an ``images`` column of ``{"bytes", "path"}`` structs and one
``<image>`` per image in the prompt's text) keep their encoded images in an ``images`` column
(``list<binary>``, :mod:`flowrl.data.images`), and each ``<image>`` becomes the image's tokens
(Qwen2-VL's ``<|vision_start|>``, one ``<|image_pad|>`` per merged patch, ``<|vision_end|>``), so
``max_prompt_length`` and every length and token budget count them; a row whose image is
unreadable, of the wrong mode or too large, or whose placeholders do not match its images, is
rejected like any other (an image prompt is never truncated: it is rejected when too long).

Ground truths are text, as verl's reward functions compare them (``str(ground_truth)``): a number
is written as text, an integral float without its ``.0`` (``10.0`` -> ``"10"``: a pandas column of
integers with a gap becomes float), so it matches the answer ``10``.

A file that cannot be read as Parquet, lacks the prompt column or has no rows raises
:class:`PromptFileError`; files of which no row is usable raise :class:`NoUsablePrompts` (with
the rejected rows, naming the longest prompt).
"""

from __future__ import annotations

import json
import logging
import math
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowrl.data import experience, images

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rejected:
    file: str
    row: int
    reason: str


class PromptFileError(ValueError):
    """A prompt file that cannot be used at all (not Parquet, truncated, no rows, no prompt
    column); ``key`` is the setting to fix besides the file (``data.prompt_key``, or empty)."""

    def __init__(self, message: str, *, file: str, key: str = "") -> None:
        super().__init__(message)
        self.file, self.key = file, key


class NoUsablePrompts(ValueError):
    """Every row was rejected; ``longest`` is the longest prompt's token count (0 if no row got
    as far as tokenizing), ``too_long`` how many rows exceeded ``max_prompt_length``,
    ``rejected`` the rows with their reasons."""

    def __init__(self, message: str, *, longest: int, too_long: int, rejected: Sequence[Rejected] = ()) -> None:
        super().__init__(message)
        self.longest, self.too_long, self.rejected = longest, too_long, list(rejected)


class OverlongPrompt(ValueError):
    """``truncation=error``: a prompt longer than ``max_prompt_length`` (verl fails too)."""


TRUNCATIONS = ("error", "left", "right", "middle")


def truncate(ids: list[int], max_len: int, mode: str) -> list[int]:
    """``ids`` cut to ``max_len`` tokens as verl's ``data.truncation``: ``left`` keeps the last
    tokens, ``right`` the first, ``middle`` the first ``max_len // 2`` and the last rest."""
    if len(ids) <= max_len:
        return ids
    if mode == "left":
        return ids[-max_len:]
    if mode == "right":
        return ids[:max_len]
    if mode == "middle":
        head = max_len // 2
        return ids[:head] + ids[len(ids) - (max_len - head):]
    raise OverlongPrompt(f"prompt has {len(ids)} tokens > data.max_prompt_length={max_len} (data.truncation=error)")


def render_prompt(prompt: Any, tokenizer: Any, tools: Sequence[dict] | None = None) -> str:
    """Chat messages through the tokenizer's chat template (or a plain string as is). ``tools``:
    the tools' schemas (OpenAI function format, ``rollout.multi_turn.tools``), passed as the
    template's ``tools``: a template with tool support renders them (Qwen's: a system block
    listing them and the ``<tool_call>`` format), one without ignores them."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, (list, tuple)) or not all(isinstance(m, dict) and "content" in m for m in prompt):
        raise ValueError("prompt must be a string or a list of {role, content} messages")
    for i, m in enumerate(prompt):
        if not isinstance(m["content"], str):  # null would render as the text "None"
            raise ValueError(f"message {i} ({m.get('role')!r}) has no text content ({m['content']!r}); "
                             "each message's content must be a string")
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False,
                                             **({"tools": list(tools)} if tools else {}))
    return "\n".join(str(m["content"]) for m in prompt)


def ground_truth_text(truth: Any) -> str:
    """A row's ``reward_model.ground_truth`` as the text reward functions compare against:
    strings as they are, integers and integral floats as integers (``10.0`` -> ``"10"``), other
    floats in their shortest form. Raises ValueError for what has no single text form: missing,
    empty, a list or mapping, a boolean, NaN or infinity."""
    if truth is None:
        raise ValueError("no reward_model.ground_truth")
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)):
        kind = "a list" if isinstance(truth, (list, tuple)) else type(truth).__name__
        raise ValueError(f"reward_model.ground_truth is {kind} ({truth!r}), not one answer; write it as a string")
    if isinstance(truth, float):
        if not math.isfinite(truth):
            raise ValueError(f"reward_model.ground_truth is {truth!r}")
        return str(int(truth)) if truth.is_integer() else repr(truth)
    text = str(truth)
    if not text.strip():
        raise ValueError("empty reward_model.ground_truth")
    return text


def dropped_text(tokenizer: Any, text: str, ids: Sequence[int]) -> str:
    """The characters of ``text`` that its token ids do not carry (mapped to the unknown token,
    or dropped), found by decoding them again; empty when nothing is lost (byte-level BPE and
    byte-fallback tokenizers lose nothing)."""
    decoded = tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    text, decoded = _comparable(text), _comparable(decoded)  # what a tokenizer's normaliser may change
    missing = Counter(c for c in text if not c.isspace())
    missing.subtract(Counter(decoded))
    lost = []
    for c in text:
        if missing.get(c, 0) > 0:
            lost.append(c)
            missing[c] -= 1
    return "".join(lost)


def _comparable(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


# The last few loads, so the pre-flight check and the run share one tokenization of a file.
_LOADED: dict[tuple, tuple] = {}
_MAX_LOADED = 4


def _load_key(files: Sequence[str], tokenizer: Any, *args: Any) -> tuple | None:
    """What a load depends on, or None (not cached: a tokenizer built in code, a missing file)."""
    name = getattr(tokenizer, "name_or_path", "")
    if not name:
        return None
    try:
        stats = tuple((f, Path(f).stat().st_size, Path(f).stat().st_mtime_ns) for f in files)
    except OSError:
        return None
    template = getattr(tokenizer, "chat_template", None)
    return (stats, type(tokenizer).__name__, name, len(tokenizer), str(template), *args)


class PromptDataset:
    def __init__(self, files: Sequence[str | Path], tokenizer: Any, *, prompt_key: str = "prompt", max_prompt_length: int = 512,
                 filter_overlong: bool = True, truncation: str = "error", tools: Sequence[dict] | None = None) -> None:
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation={truncation!r}: use one of {', '.join(TRUNCATIONS)}")
        files = [str(f) for f in files]
        self.tools = list(tools) if tools else None  # the chat template's tools (render_prompt)
        key = _load_key(files, tokenizer, prompt_key, max_prompt_length, filter_overlong, truncation,
                        json.dumps(self.tools, sort_keys=True))
        if key is not None and key in _LOADED:
            self.table, rejected, self.longest, origins = _LOADED[key]
            self.rejected, self.origins = list(rejected), list(origins)
            return
        self.rejected: list[Rejected] = []
        self.origins: list[tuple[str, int]] = []  # (file, row) of each kept row, in table order
        self.longest = 0  # tokens of the longest prompt seen (kept or not)
        self._cut = (filter_overlong, truncation)
        rows: dict[str, list] = {"data_source": [], "ground_truth": [], "prompt_ids": [], "extra_info": [], "images": []}
        self._images: Any = None  # the model's image processor, once a row has images (flowrl.data.images)
        for file in files:
            for i, row in enumerate(read_prompt_rows(file, prompt_key)):
                try:
                    ids, truth, source = self._parse(row, tokenizer, prompt_key, max_prompt_length, file)
                except OverlongPrompt as exc:
                    raise OverlongPrompt(f"{file} row {i}: {exc}") from None
                except PromptFileError:
                    raise
                except ValueError as exc:
                    self.rejected.append(Rejected(file, i, str(exc)))
                    continue
                rows["data_source"].append(source)
                rows["ground_truth"].append(truth)
                rows["prompt_ids"].append(ids)
                rows["images"].append(self._row_images)
                rows["extra_info"].append(json.dumps(row.get("extra_info") or {}, default=str))
                self.origins.append((file, i))
        if self.rejected:
            log.warning("%d prompt rows rejected; first: %s", len(self.rejected), self.rejected[0])
        if not rows["prompt_ids"]:
            too_long = sum("max_prompt_length" in r.reason for r in self.rejected)
            first = self.rejected[0]
            raise NoUsablePrompts(f"no usable prompt rows in {', '.join(files)} ({len(self.rejected)} rejected; "
                                  f"first: {first.file} row {first.row}: {first.reason})",
                                  longest=self.longest, too_long=too_long, rejected=self.rejected)
        self.table = pa.table(
            {
                "data_source": pa.array(rows["data_source"], pa.string()),
                "ground_truth": pa.array(rows["ground_truth"], pa.string()),
                "prompt_ids": experience.from_lists(rows["prompt_ids"], experience.TOKEN_IDS),
                "extra_info": pa.array(rows["extra_info"], pa.string()),
                # multimodal rows: the encoded images (list<binary>), decoded only where the model runs
                **({images.IMAGES_COLUMN: pa.array(rows["images"], images.IMAGES_TYPE)}
                   if any(rows["images"]) else {}),
            }
        )
        if key is not None:
            while len(_LOADED) >= _MAX_LOADED:
                _LOADED.pop(next(iter(_LOADED)))
            _LOADED[key] = (self.table, tuple(self.rejected), self.longest, tuple(self.origins))

    def _parse(self, row: dict, tokenizer: Any, prompt_key: str, max_len: int,
               file: str = "") -> tuple[list[int], str, str]:
        self._row_images = []
        reward = row.get("reward_model") or {}
        truth = ground_truth_text(reward.get("ground_truth") if isinstance(reward, dict) else None)
        source = row.get("data_source")
        if not isinstance(source, str) or not source:
            raise ValueError("no data_source")
        prompt = row.get(prompt_key)
        if row.get(images.IMAGES_COLUMN):
            prompt = self._with_images(prompt, row[images.IMAGES_COLUMN], tokenizer, file)
        text = render_prompt(prompt, tokenizer, self.tools)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError("empty prompt")
        lost = dropped_text(tokenizer, text, ids)
        if lost:
            raise ValueError(f"prompt has characters outside the tokenizer's vocabulary ({lost!r}), which its "
                             "tokens would drop or replace by the unknown token")
        self.longest = max(self.longest, len(ids))
        filter_overlong, truncation = self._cut
        if len(ids) > max_len:
            if self._row_images:  # a cut would split an image's tokens
                raise ValueError(f"prompt has {len(ids)} tokens (image tokens included) > "
                                 f"data.max_prompt_length={max_len}; an image prompt is not truncated")
            if filter_overlong:
                raise ValueError(f"prompt has {len(ids)} tokens > data.max_prompt_length={max_len}")
            ids = truncate(ids, max_len, truncation)
        return ids, truth, source

    def _with_images(self, prompt: Any, entries: Sequence[Any], tokenizer: Any, file: str) -> Any:
        """``prompt`` with each ``<image>`` written as the image's tokens (its size read from the
        header); the row's encoded images kept in ``_row_images``. ValueError (a rejected row) for
        an image that is unreadable, of the wrong mode or too large, or placeholders that do not
        match the images; :class:`PromptFileError` when the model has no image processor."""
        if self._images is None:
            self._images = images.load_image_processor(getattr(tokenizer, "name_or_path", ""))
            if self._images is None:
                raise PromptFileError(f"{file} has images but the model {getattr(tokenizer, 'name_or_path', '')!r} "
                                      "has no image processor (preprocessor_config.json); use a vision-language "
                                      "model (e.g. Qwen2-VL) for image prompts", file=file, key="model.path")
        out, self._row_images = image_prompt(prompt, entries, self._images, base_dir=Path(file).parent if file else None)
        return out

    def __len__(self) -> int:
        return self.table.num_rows

    def batch(self, step: int, batch_size: int, *, seed: int = 0, shuffle: bool = True) -> pa.Table:
        """The prompts of ``step``: epochs are permutations (drop-last), as verl's sampler."""
        per_epoch = len(self) // batch_size
        if per_epoch == 0:
            raise ValueError(f"data.train_batch_size={batch_size} exceeds the {len(self)} usable prompts; lower it")
        epoch, index = divmod(step, per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(self)) if shuffle else np.arange(len(self))
        picked = order[index * batch_size : (index + 1) * batch_size]
        table = self.table.take(pa.array(picked))
        group = pa.array(np.arange(batch_size, dtype=np.int64) + step * batch_size)
        return experience.with_columns(table, group=group)

    def write_rejected(self, path: str | Path) -> None:
        write_rejected(self.rejected, path)


def image_prompt(prompt: Any, entries: Sequence[Any], processor: Any, *,
                 base_dir: str | Path | None = None) -> tuple[list[dict], list[bytes]]:
    """A multimodal row's chat messages with each ``<image>`` written as its image's tokens
    (``processor``: the model's image processor; sizes from the headers), and the row's encoded
    images; ValueError for a bad image or placeholders that do not match the images."""
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, (list, tuple)) or not all(isinstance(m, dict) for m in prompt):
        raise ValueError("prompt must be a string or a list of {role, content} messages")
    counts, data = [], []
    for k, entry in enumerate(entries):
        try:
            blob = images.image_bytes(entry, base_dir=base_dir)
            width, height = images.check_image(blob)
        except ValueError as exc:
            raise ValueError(f"image {k}: {exc}") from None
        counts.append(images.image_token_count(width, height, processor))
        data.append(blob)
    out, used = [], 0
    for m in prompt:
        content = m.get("content")
        if isinstance(content, str) and images.PLACEHOLDER in content:
            n = content.count(images.PLACEHOLDER)
            if used + n > len(counts):
                raise ValueError(f"prompt has more {images.PLACEHOLDER} placeholders than the row's {len(counts)} "
                                 f"images; write one {images.PLACEHOLDER} per image")
            m = {**m, "content": images.expand_placeholders(content, counts[used:used + n])}
            used += n
        out.append(m)
    if used != len(counts):
        raise ValueError(f"prompt has {used} {images.PLACEHOLDER} placeholders but the row has {len(counts)} "
                         f"images; write one {images.PLACEHOLDER} per image")
    return out, data


def write_rejected(rejected: Sequence[Rejected], path: str | Path) -> None:
    """``rejected_prompts.jsonl``: one ``{"file", "row", "reason"}`` object per rejected row."""
    with open(path, "w") as fh:
        for r in rejected:
            fh.write(json.dumps(r.__dict__) + "\n")


def read_prompt_rows(file: str, prompt_key: str) -> list[dict]:
    """The rows of one Parquet prompt file; :class:`PromptFileError` for a file that is not
    readable Parquet, has no rows or lacks the ``prompt_key`` column."""
    if not Path(file).is_file():
        raise FileNotFoundError(f"data file {file!r} does not exist; check data.train_files")
    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError) as exc:
        size = Path(file).stat().st_size
        what = "is empty (0 bytes)" if size == 0 else f"is not a readable Parquet file ({type(exc).__name__}: {exc})"
        raise PromptFileError(f"{file} {what}", file=file) from None
    if prompt_key not in table.column_names:
        raise PromptFileError(f"{file} has no column {prompt_key!r} (data.prompt_key; its columns: "
                              f"{', '.join(table.column_names)})", file=file, key="data.prompt_key")
    if table.num_rows == 0:
        raise PromptFileError(f"{file} has no rows", file=file)
    return table.to_pylist()

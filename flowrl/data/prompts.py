"""Prompt datasets in verl's Parquet format, tokenized once, served in deterministic batches.

Columns read: ``prompt`` (chat messages, or a plain string), ``data_source``,
``reward_model.ground_truth`` and optionally ``extra_info``. Rows that cannot be used (missing
fields, a prompt longer than ``max_prompt_length`` tokens) are reported with their file, row and
reason -- logged, kept in :attr:`PromptDataset.rejected` and written by the trainer to
``rejected_prompts.jsonl`` -- never dropped silently. An overlong prompt is left out
(``filter_overlong``) or cut as verl's ``data.truncation`` says (``left`` keeps the end, ``right``
the start, ``middle`` both halves; ``error`` fails). A file of which no row is usable raises
:class:`NoUsablePrompts`, naming the longest prompt.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowrl.data import experience

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rejected:
    file: str
    row: int
    reason: str


class NoUsablePrompts(ValueError):
    """Every row was rejected; ``longest`` is the longest prompt's token count (0 if no row got
    as far as tokenizing), ``too_long`` how many rows exceeded ``max_prompt_length``."""

    def __init__(self, message: str, *, longest: int, too_long: int) -> None:
        super().__init__(message)
        self.longest, self.too_long = longest, too_long


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


def render_prompt(prompt: Any, tokenizer: Any) -> str:
    """Chat messages through the tokenizer's chat template (or a plain string as is)."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, (list, tuple)) or not all(isinstance(m, dict) and "content" in m for m in prompt):
        raise ValueError("prompt must be a string or a list of {role, content} messages")
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
    return "\n".join(str(m["content"]) for m in prompt)


class PromptDataset:
    def __init__(self, files: Sequence[str | Path], tokenizer: Any, *, prompt_key: str = "prompt", max_prompt_length: int = 512,
                 filter_overlong: bool = True, truncation: str = "error") -> None:
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation={truncation!r}: use one of {', '.join(TRUNCATIONS)}")
        self.rejected: list[Rejected] = []
        self.longest = 0  # tokens of the longest prompt seen (kept or not)
        self._cut = (filter_overlong, truncation)
        rows: dict[str, list] = {"data_source": [], "ground_truth": [], "prompt_ids": [], "extra_info": []}
        for file in files:
            file = str(file)
            if not Path(file).is_file():
                raise FileNotFoundError(f"data file {file!r} does not exist; check data.train_files")
            table = pq.read_table(file)
            if prompt_key not in table.column_names:
                raise ValueError(f"{file}: no column {prompt_key!r} (columns: {table.column_names}); set data.prompt_key")
            for i, row in enumerate(table.to_pylist()):
                try:
                    ids, truth, source = self._parse(row, tokenizer, prompt_key, max_prompt_length)
                except OverlongPrompt as exc:
                    raise OverlongPrompt(f"{file} row {i}: {exc}") from None
                except ValueError as exc:
                    self.rejected.append(Rejected(file, i, str(exc)))
                    continue
                rows["data_source"].append(source)
                rows["ground_truth"].append(truth)
                rows["prompt_ids"].append(ids)
                rows["extra_info"].append(json.dumps(row.get("extra_info") or {}, default=str))
        if self.rejected:
            log.warning("%d prompt rows rejected; first: %s", len(self.rejected), self.rejected[0])
        if not rows["prompt_ids"]:
            too_long = sum("max_prompt_length" in r.reason for r in self.rejected)
            raise NoUsablePrompts(f"no usable prompt rows in {list(map(str, files))}; first problem: {self.rejected[:1]}",
                                  longest=self.longest, too_long=too_long)
        self.table = pa.table(
            {
                "data_source": pa.array(rows["data_source"], pa.string()),
                "ground_truth": pa.array(rows["ground_truth"], pa.string()),
                "prompt_ids": experience.from_lists(rows["prompt_ids"], experience.TOKEN_IDS),
                "extra_info": pa.array(rows["extra_info"], pa.string()),
            }
        )

    def _parse(self, row: dict, tokenizer: Any, prompt_key: str, max_len: int) -> tuple[list[int], str, str]:
        reward = row.get("reward_model") or {}
        truth = reward.get("ground_truth") if isinstance(reward, dict) else None
        if truth is None:
            raise ValueError("no reward_model.ground_truth")
        source = row.get("data_source")
        if not isinstance(source, str) or not source:
            raise ValueError("no data_source")
        text = render_prompt(row.get(prompt_key), tokenizer)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError("empty prompt")
        self.longest = max(self.longest, len(ids))
        filter_overlong, truncation = self._cut
        if len(ids) > max_len:
            if filter_overlong:
                raise ValueError(f"prompt has {len(ids)} tokens > data.max_prompt_length={max_len}")
            ids = truncate(ids, max_len, truncation)
        return ids, str(truth), source

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
        with open(path, "w") as fh:
            for r in self.rejected:
                fh.write(json.dumps(r.__dict__) + "\n")

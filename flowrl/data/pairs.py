"""Preference pairs (TRL's format) for DPO and reward-model training: a prompt column
(``data.prompt_key``: chat messages or a string) and ``chosen`` / ``rejected`` completions (strings,
or TRL's conversational form: a list holding one assistant message).

Each pair becomes two adjacent rows of the experience layout, chosen first: the same
``prompt_ids`` (the prompt through the chat template with its generation prompt, as the rollout
renders it) and the completion's tokens plus EOS as ``response_ids``, every response token in
``response_mask``. Batches hold whole pairs (:class:`PairDataset`); ``data.train_batch_size``
counts pairs. Rows that cannot be used are reported with file, row and reason.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from flowrl.data.chat import OverlongRow, TokenRows, cut, encode_prompt_response, read_rows, token_table
from flowrl.data.prompts import Rejected

log = logging.getLogger(__name__)

CHOSEN_KEY = "chosen"
REJECTED_KEY = "rejected"


def completion_text(value: Any, key: str) -> str:
    """A completion as text: a string, or TRL's ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], dict):
        value = value[0].get("content")
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} is {value!r}; it must be a non-empty string (or one assistant message)")
    return value


class PairDataset(TokenRows):
    """The pairs of ``files``: rows ``2i`` (chosen) and ``2i + 1`` (rejected) of :attr:`table`."""

    rows_per_unit = 2

    def __init__(self, files: Sequence[str], tokenizer: Any, *, prompt_key: str = "prompt", max_length: int = 1024,
                 truncation: str = "error") -> None:
        prompts, responses, masks, rejected = [], [], [], []
        for file in files:
            rows = read_rows(file, [prompt_key, CHOSEN_KEY, REJECTED_KEY], "data.prompt_key; pairs need the columns "
                             f"{CHOSEN_KEY!r} and {REJECTED_KEY!r}")
            for i, row in enumerate(rows):
                try:
                    pair = [cut(encode_prompt_response(row[prompt_key], completion_text(row[key], key), tokenizer),
                                max_length, truncation) for key in (CHOSEN_KEY, REJECTED_KEY)]
                    if min(e.mask.index(1) for e in pair) == 0:
                        raise ValueError("no prompt token left (data.truncation=left cut the whole prompt)")
                except OverlongRow as exc:
                    raise OverlongRow(f"{file} row {i}: {exc} (data.truncation=error); raise algorithm.sft.max_length "
                                      "or set data.truncation=right") from None
                except ValueError as exc:
                    rejected.append(Rejected(file, i, str(exc)))
                    continue
                for encoded in pair:
                    first = encoded.mask.index(1)
                    prompts.append(encoded.ids[:first])
                    responses.append(encoded.ids[first:])
                    masks.append(encoded.mask[first:])
        if rejected:
            log.warning("%d preference pairs rejected; first: %s", len(rejected), rejected[0])
        if not prompts:
            raise ValueError(f"no usable preference pairs in {', '.join(files)} ({len(rejected)} rejected"
                             + (f"; first: {rejected[0].file} row {rejected[0].row}: {rejected[0].reason})" if rejected else ")"))
        super().__init__(token_table(prompts, responses, masks), rejected)


def pairs_from_samples(prompts: Sequence[Any], answers: Sequence[Sequence[str]], scores: Sequence[Sequence[float]],
                       *, max_pairs_per_prompt: int = 1) -> list[dict]:
    """Preference pairs from a model's own samples: for each prompt, its best-scored answer (the
    first in sample order) as ``chosen`` against each distinct answer scored below it, worst
    first (ties in sample order), up to ``max_pairs_per_prompt`` pairs. A prompt whose answers all
    score the same (all right, or all wrong) gives none. ``answers[i]`` and ``scores[i]`` are
    prompt ``i``'s samples and their rewards."""
    if not len(prompts) == len(answers) == len(scores):
        raise ValueError(f"{len(prompts)} prompts, {len(answers)} answer lists and {len(scores)} score lists: "
                         "give one answer list and one score list per prompt")
    if max_pairs_per_prompt < 1:
        raise ValueError(f"max_pairs_per_prompt={max_pairs_per_prompt} must be at least 1")
    out = []
    for prompt, texts, values in zip(prompts, answers, scores):
        if len(texts) != len(values):
            raise ValueError(f"{len(texts)} answers but {len(values)} scores for prompt {prompt!r}")
        if not texts:
            continue
        best = max(range(len(values)), key=lambda k: (values[k], -k))
        worse = sorted((k for k in range(len(values)) if values[k] < values[best]), key=lambda k: (values[k], k))
        seen: set[str] = set()
        for k in worse:
            if texts[k] not in seen and len(seen) < max_pairs_per_prompt:
                seen.add(texts[k])
                out.append({"prompt": prompt, CHOSEN_KEY: texts[best], REJECTED_KEY: texts[k]})
    return out

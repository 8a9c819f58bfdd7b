"""Chat-format SFT data (verl's SFT Parquet): conversations tokenized once, the assistant's tokens
marked, served in deterministic batches.

A row is either a ``messages`` column (``algorithm.sft.messages_key``, verl's
``data.messages_key``: a list of ``{role, content}``) or a prompt column (``data.prompt_key``:
chat messages or a string) with a response column (``algorithm.sft.response_key``, a string).

Tokens: a single final assistant turn (and every prompt/response row) is tokenized as the rollout
sees it: the prompt through the chat template with its generation prompt, then the response text
and the tokenizer's EOS, every response token trained. A conversation with several assistant
turns is rendered turn by turn through the template: the text an assistant message adds after
``template(messages[:i], add_generation_prompt=True)`` is trained (its end-of-turn tokens too),
every other token is not; each piece is tokenized on its own and concatenated (as verl's
multi-turn SFT dataset). A template that does not render assistant messages is refused for them.

The experience layout: ``prompt_ids`` are the tokens before the first trained token,
``response_ids`` the rest, ``response_mask`` 1 on trained tokens; the losses read log-probs of
``response_ids`` only (``flowrl.algos.sft_loss``). Rows that cannot be used are reported with
file, row and reason, never dropped silently (as :mod:`flowrl.data.prompts`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowrl.data import experience
from flowrl.data.prompts import Rejected, render_prompt, truncate, write_rejected

log = logging.getLogger(__name__)

MASK = pa.list_(pa.int8())
SFT_TRUNCATIONS = ("error", "left", "right")


class OverlongRow(ValueError):
    """``data.truncation=error``: a row longer than ``algorithm.sft.max_length`` (verl fails too)."""


@dataclass(frozen=True)
class Encoded:
    """One row's tokens: ``ids`` in order and ``mask`` (1: trained), of the same length."""

    ids: list[int]
    mask: list[int]


def _tokens(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def encode_prompt_response(prompt: Any, response: str, tokenizer: Any) -> Encoded:
    """``render(prompt) + response + EOS``: the prompt untrained, the response and EOS trained."""
    if not isinstance(response, str) or not response:
        raise ValueError(f"response is {response!r}; it must be a non-empty string")
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token, which ends each trained response")
    prompt_ids = _tokens(tokenizer, render_prompt(prompt, tokenizer))
    response_ids = _tokens(tokenizer, response) + [tokenizer.eos_token_id]
    return Encoded(prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids))


def _check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} is {m!r}; each message needs a string role and string content")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("no assistant message: nothing to train on")
    return [dict(m) for m in messages]


def encode_messages(messages: Any, tokenizer: Any) -> Encoded:
    """A conversation's tokens with the assistant's marked (see the module docstring)."""
    messages = _check_messages(messages)
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if assistant == [len(messages) - 1]:  # one final answer: the prompt as the rollout renders it
        return encode_prompt_response(messages[:-1], messages[-1]["content"], tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("several assistant turns need the tokenizer's chat template, which it lacks")
    ids: list[int] = []
    mask: list[int] = []
    done = ""  # text rendered so far
    for i in assistant:
        before = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=False) if i else ""
        after = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (before.startswith(done) and after.startswith(before)) or messages[i]["content"] not in after[len(before):]:
            raise ValueError(f"the chat template does not render assistant message {i} after the conversation before "
                             "it; use one final assistant turn per row (or prompt/response columns)")
        untrained, trained = _tokens(tokenizer, before[len(done):]), _tokens(tokenizer, after[len(before):])
        ids += untrained + trained
        mask += [0] * len(untrained) + [1] * len(trained)
        done = after
    return Encoded(ids, mask)


def cut(encoded: Encoded, max_length: int, truncation: str) -> Encoded:
    """At most ``max_length`` tokens (``data.truncation``: ``right`` keeps the start, ``left`` the
    end, ``error`` refuses); ValueError when nothing trained is left."""
    if len(encoded.ids) > max_length:
        if truncation == "error":
            raise OverlongRow(f"row has {len(encoded.ids)} tokens > algorithm.sft.max_length={max_length}")
        encoded = Encoded(truncate(encoded.ids, max_length, truncation), truncate(encoded.mask, max_length, truncation))
    if not any(encoded.mask):
        raise ValueError("no trained (assistant) token within algorithm.sft.max_length")
    return encoded


def split_at_first_trained(encoded: Encoded) -> tuple[list[int], list[int], list[int]]:
    """(prompt_ids, response_ids, response_mask): the prompt is everything before the first
    trained token (at least one token: the first token is never predicted)."""
    first = max(encoded.mask.index(1), 1)
    return encoded.ids[:first], encoded.ids[first:], encoded.mask[first:]


def read_rows(file: str, columns: Sequence[str], what: str) -> list[dict]:
    """The rows of one Parquet file, which must have ``columns`` (``what``: the key to fix)."""
    if not Path(file).is_file():
        raise FileNotFoundError(f"data file {file!r} does not exist; check data.train_files / data.val_files")
    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{file} is not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"{file} has no column {', '.join(map(repr, missing))} ({what}; its columns: "
                         f"{', '.join(table.column_names)})")
    if table.num_rows == 0:
        raise ValueError(f"{file} has no rows")
    return table.select(list(columns)).to_pylist()


class TokenRows:
    """Tokenized rows (one per unit: a conversation, or a pair as two adjacent rows) and the
    deterministic batches of a step, as :meth:`flowrl.data.prompts.PromptDataset.batch`."""

    rows_per_unit = 1

    def __init__(self, table: pa.Table, rejected: Sequence[Rejected]) -> None:
        self.table = table
        self.rejected = list(rejected)

    def __len__(self) -> int:
        return self.table.num_rows // self.rows_per_unit

    def batch(self, step: int, batch_size: int, *, seed: int = 0, shuffle: bool = True) -> pa.Table:
        """The ``batch_size`` units of ``step``: epochs are permutations (drop-last)."""
        per_epoch = len(self) // batch_size
        if per_epoch == 0:
            raise ValueError(f"data.train_batch_size={batch_size} exceeds the {len(self)} usable rows; lower it")
        epoch, index = divmod(step, per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(self)) if shuffle else np.arange(len(self))
        units = order[index * batch_size: (index + 1) * batch_size]
        k = self.rows_per_unit
        return self.table.take(pa.array((units[:, None] * k + np.arange(k)[None, :]).reshape(-1)))

    def write_rejected(self, path: str | Path) -> None:
        write_rejected(self.rejected, path)


class ChatDataset(TokenRows):
    """SFT rows of ``files`` (see the module docstring)."""

    def __init__(self, files: Sequence[str], tokenizer: Any, *, messages_key: str = "messages",
                 prompt_key: str = "prompt", response_key: str = "response", max_length: int = 1024,
                 truncation: str = "error") -> None:
        if truncation not in SFT_TRUNCATIONS:
            raise ValueError(f"data.truncation={truncation!r} cannot cut a conversation; use one of "
                             f"{', '.join(SFT_TRUNCATIONS)}")
        prompts, responses, masks, rejected = [], [], [], []
        for file in files:
            first = pq.read_schema(file).names if Path(file).is_file() else []
            keys = [messages_key] if messages_key in first else [prompt_key, response_key]
            for i, row in enumerate(read_rows(file, keys, "algorithm.sft.messages_key, or data.prompt_key with "
                                                         "algorithm.sft.response_key")):
                try:
                    encoded = (encode_messages(row[messages_key], tokenizer) if len(keys) == 1
                               else encode_prompt_response(row[prompt_key], row[response_key], tokenizer))
                    prompt, response, mask = split_at_first_trained(cut(encoded, max_length, truncation))
                except OverlongRow as exc:
                    raise OverlongRow(f"{file} row {i}: {exc} (data.truncation=error); raise algorithm.sft.max_length "
                                      "or set data.truncation=right") from None
                except ValueError as exc:
                    rejected.append(Rejected(file, i, str(exc)))
                    continue
                prompts.append(prompt)
                responses.append(response)
                masks.append(mask)
        if rejected:
            log.warning("%d SFT rows rejected; first: %s", len(rejected), rejected[0])
        if not prompts:
            raise ValueError(f"no usable SFT rows in {', '.join(files)} ({len(rejected)} rejected"
                             + (f"; first: {rejected[0].file} row {rejected[0].row}: {rejected[0].reason})" if rejected else ")"))
        super().__init__(token_table(prompts, responses, masks), rejected)


def token_table(prompts: Sequence[list[int]], responses: Sequence[list[int]], masks: Sequence[list[int]]) -> pa.Table:
    """The experience layout of tokenized rows (``prompt_ids``, ``response_ids``, ``response_mask``)."""
    return pa.table({"prompt_ids": experience.from_lists(prompts, experience.TOKEN_IDS),
                     "response_ids": experience.from_lists(responses, experience.TOKEN_IDS),
                     "response_mask": experience.from_lists(masks, MASK)})

"""Padded ``[b, s]`` micro-batches of prompt+response rows for the megatron schedules (pure).

Row ``i`` holds ``prompt + response`` minus its last token as input and the same shifted by one as
labels, right-padded with token 0 to the batch's longest row. Response token ``j`` of a row with
prompt length ``P`` is predicted at position ``P - 1 + j``: ``index_T`` lists those flat
``b * s + position`` positions, row after row, so ``logits.reshape(b * s, V)[index_T]`` are exactly
the response tokens' logits in item order. Padding rows and padding micro-batches (to fill the last
micro-batch, or to make the count a multiple of the pipeline size for the interleaved schedule)
carry no response tokens.

Shapes: B = micro-batch rows, S = padded sequence length, T = response tokens of a micro-batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch


@dataclasses.dataclass(kw_only=True)
class MicroBatch:
    """One micro-batch: padded inputs, and where its items' response tokens sit."""

    index: int
    items: list[dict[str, Any]]
    tokens_BS: torch.Tensor
    labels_BS: torch.Tensor
    index_T: torch.Tensor
    cu_seqlens_B1: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.index_T.numel())

    def to(self, device: torch.device) -> "MicroBatch":
        return dataclasses.replace(
            self, tokens_BS=self.tokens_BS.to(device), labels_BS=self.labels_BS.to(device),
            index_T=self.index_T.to(device), cu_seqlens_B1=self.cu_seqlens_B1.to(device))


def _check_item(i: int, item: dict[str, Any]) -> None:
    for key in ("prompt_ids", "response_ids"):
        if key not in item:
            raise ValueError(f"batch item {i} has no {key!r}; each item needs 'prompt_ids' and "
                             "'response_ids' (lists of token ids)")
    if len(item["prompt_ids"]) == 0:
        raise ValueError(f"batch item {i} has an empty prompt; the first response token needs at "
                         "least one prompt token to be predicted from")


def make_micro_batches(batch: Sequence[dict[str, Any]], *, micro_batch_size: int,
                       num_microbatches_multiple: int = 1,
                       seq_len_multiple: int = 1) -> tuple[list[MicroBatch], int]:
    """Split ``batch`` into padded micro-batches; returns them and the padded sequence length S
    (a multiple of ``seq_len_multiple``: sequence parallelism splits S over tp ranks)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 1")
    if not batch:
        raise ValueError("batch is empty; pass at least one item")
    for i, item in enumerate(batch):
        _check_item(i, item)
    seq_len = max(1, *(len(it["prompt_ids"]) + len(it["response_ids"]) - 1 for it in batch))
    seq_len = -(-seq_len // seq_len_multiple) * seq_len_multiple
    num_mb = -(-len(batch) // micro_batch_size)
    num_mb = -(-num_mb // num_microbatches_multiple) * num_microbatches_multiple
    micro_batches = []
    for m in range(num_mb):
        items = list(batch[m * micro_batch_size:(m + 1) * micro_batch_size])
        tokens_BS = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
        labels_BS = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
        index, lengths = [], [0]
        for b, item in enumerate(items):
            prompt, response = list(item["prompt_ids"]), list(item["response_ids"])
            row = torch.tensor(prompt + response, dtype=torch.long)
            tokens_BS[b, : len(row) - 1] = row[:-1]
            labels_BS[b, : len(row) - 1] = row[1:]
            start = b * seq_len + len(prompt) - 1
            index.append(torch.arange(start, start + len(response)))
            lengths.append(len(response))
        index_T = torch.cat(index) if index else torch.zeros(0, dtype=torch.long)
        micro_batches.append(MicroBatch(
            index=m, items=items, tokens_BS=tokens_BS, labels_BS=labels_BS, index_T=index_T,
            cu_seqlens_B1=torch.tensor(lengths, dtype=torch.long).cumsum(0)))
    return micro_batches, seq_len

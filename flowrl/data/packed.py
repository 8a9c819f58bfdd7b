"""Packed token batches: the torch view of an experience table that engines compute on.

Built zero-copy from the Arrow list columns (flat values + offsets). Engines that need a padded
``[B, L]`` batch (CPU attention) get one from :meth:`PackedBatch.padded`; the response-token
positions come with it so results go straight back to flat ``_T`` tensors.

Shape letters: B rows, L padded length (prompt + response), T response tokens of all rows,
P prompt tokens of all rows, B1 = B + 1 offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from flowrl.data import experience

if TYPE_CHECKING:
    import pyarrow as pa
    import torch


@dataclass
class Padded:
    input_ids_BL: "torch.Tensor"
    attention_mask_BL: "torch.Tensor"
    row_T: "torch.Tensor"  # row of each response token
    pos_T: "torch.Tensor"  # position of each response token in its padded row


@dataclass
class PackedBatch:
    prompt_P: "torch.Tensor"
    prompt_cu_B1: "torch.Tensor"
    response_T: "torch.Tensor"
    response_cu_B1: "torch.Tensor"
    token_fields: dict[str, "torch.Tensor"] = field(default_factory=dict)  # flat, aligned with response_T

    @classmethod
    def from_table(cls, table: "pa.Table", token_fields: tuple[str, ...] = ()) -> "PackedBatch":
        prompt, prompt_cu = experience.token_column(table, "prompt_ids")
        response, response_cu = experience.token_column(table, "response_ids")
        fields = {}
        for name in token_fields:
            values, cu = experience.token_column(table, name)
            if not (cu.shape == response_cu.shape and bool((cu == response_cu).all())):
                raise ValueError(f"column {name!r} is not aligned with response_ids (row lengths differ)")
            fields[name] = values
        return cls(prompt, prompt_cu, response, response_cu, fields)

    @property
    def num_rows(self) -> int:
        return self.response_cu_B1.numel() - 1

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_cu_B1[-1] - self.response_cu_B1[0])

    def rows(self, start: int, stop: int) -> "PackedBatch":
        """Rows ``[start, stop)`` as a batch (views, offsets rebased)."""
        p0, p1 = int(self.prompt_cu_B1[start]), int(self.prompt_cu_B1[stop])
        r0, r1 = int(self.response_cu_B1[start]), int(self.response_cu_B1[stop])
        return PackedBatch(
            self.prompt_P[p0:p1],
            self.prompt_cu_B1[start : stop + 1] - p0,
            self.response_T[r0:r1],
            self.response_cu_B1[start : stop + 1] - r0,
            {k: v[r0:r1] for k, v in self.token_fields.items()},
        )

    def micro_batches(self, rows_per_micro_batch: int) -> Iterator["PackedBatch"]:
        for start in range(0, self.num_rows, rows_per_micro_batch):
            yield self.rows(start, min(start + rows_per_micro_batch, self.num_rows))

    def padded(self, pad_id: int) -> Padded:
        """Right-padded ``prompt + response`` rows and the positions of the response tokens."""
        import torch

        prompt_len_B = self.prompt_cu_B1.diff()
        response_len_B = self.response_cu_B1.diff()
        total_B = prompt_len_B + response_len_B
        num_rows, length = self.num_rows, int(total_B.max()) if self.num_rows else 0
        input_ids = torch.full((num_rows, length), pad_id, dtype=torch.long)
        rows_B = torch.arange(num_rows)
        # Scatter prompt tokens then response tokens into their rows.
        p_row = torch.repeat_interleave(rows_B, prompt_len_B)
        p_pos = torch.arange(self.prompt_P.numel()) - torch.repeat_interleave(self.prompt_cu_B1[:-1], prompt_len_B)
        input_ids[p_row, p_pos] = self.prompt_P.long()
        r_row = torch.repeat_interleave(rows_B, response_len_B)
        r_pos = (
            torch.arange(self.response_T.numel())
            - torch.repeat_interleave(self.response_cu_B1[:-1], response_len_B)
            + torch.repeat_interleave(prompt_len_B, response_len_B)
        )
        input_ids[r_row, r_pos] = self.response_T.long()
        attention_mask = (torch.arange(length)[None, :] < total_B[:, None]).long()
        return Padded(input_ids, attention_mask, r_row, r_pos)

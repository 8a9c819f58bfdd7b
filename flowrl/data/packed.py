"""Packed token batches: the torch view of an experience table that engines compute on.

Built zero-copy from the Arrow list columns (flat values + offsets). Engines that need a padded
``[B, L]`` batch (CPU attention) get one from :meth:`PackedBatch.padded`; the response-token
positions come with it so results go straight back to flat ``_T`` tensors.

With a token budget (verl's ``use_dynamic_bsz``; :meth:`PackedBatch.with_token_budget`) micro-batches
hold as many rows as fit ``max_tokens`` real tokens, and :meth:`PackedBatch.model_inputs` packs
several sequences into each line (``position_ids`` restart at 0 per sequence: transformers builds
the block-causal mask from them), so compute follows real tokens (``token_layout.py``).

With shared prompts (``actor.use_prefix_grouper``; :meth:`PackedBatch.with_shared_prompts`) each
run of consecutive rows with the same prompt (a GRPO group) is one segment (split where dense
attention over it would cost more than the shared prompt saves), the prompt computed once, its rows' responses after it under a block
attention mask; segments are packed into lines as above, with or without a token budget.
Micro-batches (which rows, how many) do not change.

Shape letters: B rows, L padded length (prompt + response), T response tokens of all rows,
P prompt tokens of all rows, B1 = B + 1 offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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
    position_ids_BL: "torch.Tensor | None" = None  # packed lines: positions restart per sequence
    block_mask_BLL: "torch.Tensor | None" = None
    """Shared prompts: which key each query attends to (bool, True: attend); replaces the mask."""
    pred_T: "torch.Tensor | None" = None
    """Position whose hidden state predicts each response token (in row ``row_T``); None: ``pos_T - 1``."""

    def __post_init__(self) -> None:
        if self.pred_T is None:
            self.pred_T = self.pos_T - 1  # rows and packed lines: the previous position predicts a token

    @property
    def num_slots(self) -> int:
        """Token positions the model computes (real tokens and padding)."""
        return int(self.input_ids_BL.numel())


@dataclass
class PackedBatch:
    prompt_P: "torch.Tensor"
    prompt_cu_B1: "torch.Tensor"
    response_T: "torch.Tensor"
    response_cu_B1: "torch.Tensor"
    token_fields: dict[str, "torch.Tensor"] = field(default_factory=dict)  # flat, aligned with response_T
    token_budget: int = 0
    """> 0: micro-batches by real tokens (at most this many, at least one row) and packed lines."""
    shared_prompts: bool = False
    """Consecutive rows with the same prompt compute it once (``token_layout.shared_prompt_lines``)."""
    images: "list[list[bytes]] | None" = None
    """Each row's encoded prompt images (a vision-language batch: the table's ``images`` column,
    :mod:`flowrl.data.images`); None: a text batch. Decoded only by the engine that runs the model."""

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
        images = table.column("images").to_pylist() if "images" in table.column_names else None
        return cls(prompt, prompt_cu, response, response_cu, fields, images=images)

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
            self.token_budget,
            self.shared_prompts,
            None if self.images is None else self.images[start:stop],
        )

    @property
    def num_tokens(self) -> int:
        """Real tokens (prompt and response) of all rows."""
        return int(self.prompt_cu_B1[-1] - self.prompt_cu_B1[0]) + self.num_response_tokens

    def with_token_budget(self, max_tokens: int) -> "PackedBatch":
        """The same rows, split by real tokens and packed (``max_tokens`` > 0) or by rows (0)."""
        return replace(self, token_budget=max_tokens)

    def with_shared_prompts(self, on: bool = True) -> "PackedBatch":
        """The same rows and micro-batches; :meth:`model_inputs` computes each group's prompt once (``on``)."""
        return replace(self, shared_prompts=on)

    def select(self, rows_B: "torch.Tensor") -> "PackedBatch":
        """The rows ``rows_B`` (indices, in that order) as a new batch (copies)."""
        from flowrl.data.token_layout import gather_rows

        prompt, prompt_cu = gather_rows(self.prompt_P, self.prompt_cu_B1, rows_B)
        response, response_cu = gather_rows(self.response_T, self.response_cu_B1, rows_B)
        fields = {k: gather_rows(v, self.response_cu_B1, rows_B)[0] for k, v in self.token_fields.items()}
        images = None if self.images is None else [self.images[i] for i in rows_B.tolist()]
        return PackedBatch(prompt, prompt_cu, response, response_cu, fields, self.token_budget, self.shared_prompts,
                           images)

    def micro_batches(self, rows_per_micro_batch: int, min_count: int = 1) -> Iterator["PackedBatch"]:
        """Consecutive rows: ``rows_per_micro_batch`` each, or with a token budget as many as fit
        it, in at least ``min_count`` micro-batches (where there are that many rows)."""
        if self.token_budget > 0:
            from flowrl.data.token_layout import budget_bounds

            total_B = self.prompt_cu_B1.diff() + self.response_cu_B1.diff()
            bounds = budget_bounds(total_B.tolist(), self.token_budget, min_count)
            for start, stop in zip(bounds[:-1], bounds[1:]):
                yield self.rows(start, stop)
            return
        for start in range(0, self.num_rows, rows_per_micro_batch):
            yield self.rows(start, min(start + rows_per_micro_batch, self.num_rows))

    def model_inputs(self, pad_id: int, pair_cost: float = 0.0) -> Padded:
        """What an engine feeds the model: shared-prompt segments packed into lines (``pair_cost``:
        an attention pair's cost against a position's, for where to split long groups; 0: never),
        else packed lines with a token budget, else padded rows."""
        if self.shared_prompts:
            from flowrl.data.token_layout import shared_prompt_lines

            ids, positions, mask, row_T, pos_T, pred_T = shared_prompt_lines(
                self.prompt_P, self.prompt_cu_B1, self.response_T, self.response_cu_B1, pad_id, pair_cost,
                self._image_breaks())
            return Padded(ids, None, row_T, pos_T, positions, block_mask_BLL=mask, pred_T=pred_T)
        if self.token_budget > 0:
            from flowrl.data.token_layout import packed_lines

            ids, positions, row_T, pos_T = packed_lines(self.prompt_P, self.prompt_cu_B1, self.response_T,
                                                        self.response_cu_B1, pad_id)
            return Padded(ids, None, row_T, pos_T, positions)
        return self.padded(pad_id)

    def _image_breaks(self) -> "torch.Tensor | None":
        """Rows whose images differ from the previous row's (they share no prompt with it: the same
        ``<image>`` tokens of another picture are another prompt); None for a text batch."""
        if self.images is None:
            return None
        import torch

        return torch.tensor([b > 0 and self.images[b] != self.images[b - 1] for b in range(self.num_rows)],
                            dtype=torch.bool)

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

"""Ulysses sequence parallelism's arithmetic: one line of tokens split over the ranks of a group.

Pure functions over a micro-batch's model inputs (:class:`~flowrl.data.packed.Padded`; no model,
no process group). ``sp`` ranks share a micro-batch: each computes the embeddings, MLPs and
logits of one contiguous slice of every line (``split_length`` pads the lines to a multiple of
``sp``), and attention sees the whole line through an all-to-all over heads
(``flowrl.backends.train.ulysses``). What each rank needs:

* :func:`full_mask` - which key each query of the whole line attends to, with the semantics the
  unsplit model applies to the same inputs: padded rows are causal over their real tokens (the
  2D attention mask), packed lines block-causal per sequence (transformers' rule: a new sequence
  wherever the position ids do not step by one), shared-prompt lines their block mask; the slots
  added to reach a multiple of ``sp`` see only themselves;
* :func:`local_inputs` - this rank's slice: its input ids, the *global* position ids of its
  columns (rotary embeddings are absolute), and the response tokens whose predicting position
  falls in the slice (``keep_T``), located in the slice; with the whole lines' mask, except for
  padded rows, whose real tokens get the same outputs from plain causal attention;
* :func:`concat_batches` - the group's rows as one batch (each rank brings its own share).

Shape letters: B rows (lines), L line length, Lp ``L`` padded to a multiple of ``sp``, Ls = Lp /
sp the slice, T response tokens, B1 = B + 1 offsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from flowrl.data.packed import PackedBatch, Padded


def split_length(length: int, sp: int) -> int:
    """``length`` rounded up to a multiple of ``sp`` (every rank gets an equal slice)."""
    if sp < 1:
        raise ValueError(f"sequence-parallel size {sp}: must be >= 1")
    return -(-length // sp) * sp


def positions_BL(padded: "Padded") -> torch.Tensor:
    """The position id of every slot: the given ones (packed and shared-prompt lines), else
    ``0..L-1`` per row (what transformers uses for padded rows without position ids)."""
    if padded.position_ids_BL is not None:
        return padded.position_ids_BL.long()
    rows, length = padded.input_ids_BL.shape
    return torch.arange(length).expand(rows, length)


def full_mask(padded: "Padded", padded_length: int) -> torch.Tensor:
    """``mask_BLpLp[b, q, k]`` (bool, True: query ``q`` attends to key ``k``) over whole lines
    padded to ``padded_length``, as the unsplit model masks ``padded``; every slot sees at least
    itself (no empty softmax row)."""
    rows, length = padded.input_ids_BL.shape
    cols = torch.arange(length)
    if padded.block_mask_BLL is not None:  # shared prompts: the mask is given
        mask = padded.block_mask_BLL.bool()
    elif padded.attention_mask_BL is not None:  # padded rows: causal over the real keys
        mask = (cols[None, :] <= cols[:, None])[None] & padded.attention_mask_BL.bool()[:, None, :]
    else:  # packed lines: block-causal, a new sequence where positions do not step by one
        pos = positions_BL(padded)
        step = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1)
        seq_BL = torch.cumsum((step != 1).long(), dim=-1)
        mask = (cols[None, :] <= cols[:, None])[None] & (seq_BL[:, :, None] == seq_BL[:, None, :])
    out = torch.zeros((rows, padded_length, padded_length), dtype=torch.bool)
    out[:, :length, :length] = mask
    return out | torch.eye(padded_length, dtype=torch.bool)[None] & ~out.any(-1, keepdim=True)


@dataclass
class LocalInputs:
    """One rank's share of a micro-batch's lines."""

    padded: "Padded"
    """Its slice: input ids ``[B, Ls]``, global position ids, no mask (attention takes
    ``mask_BLpLp``), and the response tokens it computes located in the slice."""
    keep_T: torch.Tensor
    """Which response tokens (bool over all ``T``) this rank computes: those predicted in its slice."""
    mask_BLpLp: torch.Tensor | None
    """:func:`full_mask` of the whole lines; None for padded rows: plain causal attention over the
    whole line gives their real tokens the same outputs (right padding and the split's slots come
    after every real token; their own outputs are never read), with no ``Lp x Lp`` mask built."""


def local_inputs(padded: "Padded", pad_id: int, rank: int, sp: int) -> LocalInputs:
    """Rank ``rank`` of ``sp``'s slice of ``padded`` (:class:`LocalInputs`)."""
    from flowrl.data.packed import Padded

    if not 0 <= rank < sp:
        raise ValueError(f"rank {rank} is not in a sequence-parallel group of {sp}")
    rows, length = padded.input_ids_BL.shape
    padded_length = split_length(max(length, 1), sp)
    ids = torch.full((rows, padded_length), pad_id, dtype=torch.long)
    ids[:, :length] = padded.input_ids_BL
    pos = torch.zeros((rows, padded_length), dtype=torch.long)
    pos[:, :length] = positions_BL(padded)
    width = padded_length // sp
    lo, hi = rank * width, (rank + 1) * width
    keep_T = (padded.pred_T >= lo) & (padded.pred_T < hi)
    local = Padded(ids[:, lo:hi], None, padded.row_T[keep_T], padded.pos_T[keep_T] - lo, pos[:, lo:hi],
                   pred_T=padded.pred_T[keep_T] - lo)
    causal = padded.attention_mask_BL is not None and padded.block_mask_BLL is None
    return LocalInputs(local, keep_T, None if causal else full_mask(padded, padded_length))


def concat_batches(batches: list["PackedBatch"], token_budget: int) -> "PackedBatch":
    """The rows of ``batches`` in order as one batch (token budget ``token_budget``; the shared-
    prompt switch of the first)."""
    from flowrl.data.packed import PackedBatch

    def cat_offsets(cus: list[torch.Tensor]) -> torch.Tensor:
        out, base = [torch.zeros(1, dtype=cus[0].dtype)], 0
        for cu in cus:
            rebased = cu - cu[0]
            out.append(rebased[1:] + base)
            base += int(rebased[-1])
        return torch.cat(out)

    if any(getattr(b, "images", None) is not None for b in batches):
        raise ValueError("Ulysses sequence parallelism splits text lines; a batch with images is not split "
                         "(set ulysses_sequence_parallel_size=1 for a vision-language model)")
    first = batches[0]
    fields = {k: torch.cat([b.token_fields[k] for b in batches]) for k in first.token_fields}
    return PackedBatch(torch.cat([b.prompt_P for b in batches]), cat_offsets([b.prompt_cu_B1 for b in batches]),
                       torch.cat([b.response_T for b in batches]), cat_offsets([b.response_cu_B1 for b in batches]),
                       fields, token_budget, first.shared_prompts)

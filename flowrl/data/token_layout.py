"""Token-budget micro-batches and packed lines: the layouts that make compute follow real tokens.

Pure functions over flat token tensors and offsets (no model, no process group):

* :func:`budget_bounds` splits consecutive rows into micro-batches of at most ``max_tokens`` real
  tokens (verl's ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu``), optionally into at least
  a given number of them (ranks that run collectives per micro-batch must agree on the count);
* :func:`packed_lines` packs a micro-batch's sequences into lines as long as its longest
  sequence (the longest left with the shortest that still fit), with ``position_ids`` restarting
  at 0 per sequence: transformers turns such position ids into a block-causal attention mask, so
  one line holds several sequences that never see each other.

Shape letters: B rows, B1 = B + 1 offsets, R packed lines, C line capacity (the longest
sequence), T response tokens of all rows, X any flat token values.
"""

from __future__ import annotations

import torch


def gather_rows(values_X: torch.Tensor, cu_B1: torch.Tensor, rows_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ragged rows ``rows_B`` of (``values_X``, offsets ``cu_B1``): new flat values and offsets."""
    rows_B = rows_B.long()
    lengths = cu_B1.diff()[rows_B]
    new_cu = torch.zeros(rows_B.numel() + 1, dtype=cu_B1.dtype)
    torch.cumsum(lengths, 0, out=new_cu[1:])
    shift = torch.repeat_interleave(cu_B1[:-1][rows_B] - new_cu[:-1], lengths)
    index = torch.arange(int(new_cu[-1]), dtype=torch.long) + shift.long()
    return values_X[index], new_cu


def budget_bounds(lengths: list[int], max_tokens: int, min_groups: int = 1) -> list[int]:
    """Row boundaries ``[0, ..., len(lengths)]`` of consecutive groups holding at most
    ``max_tokens`` tokens each (a longer row alone); with fewer than ``min_groups`` groups, the
    rows are re-split into ``min(min_groups, rows)`` groups of about equal tokens."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens={max_tokens}: a token budget must be > 0")
    bounds, used = [0], 0
    for i, n in enumerate(lengths):
        if used and used + n > max_tokens:
            bounds.append(i)
            used = 0
        used += n
    if lengths:
        bounds.append(len(lengths))
    if len(bounds) - 1 < min_groups and lengths:
        bounds = _equal_token_bounds(lengths, min(min_groups, len(lengths)))
    return bounds


def _equal_token_bounds(lengths: list[int], groups: int) -> list[int]:
    """``groups`` consecutive non-empty groups, cut where the running token count passes k/groups."""
    total = sum(lengths)
    bounds, running = [0], 0
    for i, n in enumerate(lengths):
        running += n
        rows_left, groups_left = len(lengths) - (i + 1), groups - len(bounds)
        if groups_left > 0 and (running * groups >= total * len(bounds) or rows_left == groups_left):
            bounds.append(i + 1)
    bounds.append(len(lengths))
    return bounds


def assign_lines(lengths: list[int], capacity: int = 0) -> tuple[list[int], list[int], int]:
    """Line and offset of each sequence, and the line capacity (``capacity``, at least the longest
    sequence): each line takes the longest sequences left while they fit, then the shortest."""
    capacity = max(capacity, max(lengths, default=0))
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    line_of, offset_of = [0] * len(lengths), [0] * len(lengths)
    lo, hi, line = 0, len(order) - 1, 0
    while lo <= hi:
        used = 0
        while lo <= hi and used + lengths[order[lo]] <= capacity:
            line_of[order[lo]], offset_of[order[lo]] = line, used
            used += lengths[order[lo]]
            lo += 1
        while lo <= hi and used + lengths[order[hi]] <= capacity:
            line_of[order[hi]], offset_of[order[hi]] = line, used
            used += lengths[order[hi]]
            hi -= 1
        line += 1
    return line_of, offset_of, capacity


# Line lengths tried: 1..LONG_LINE_FACTOR times the longest sequence, up to LONG_LINE_TOKENS
# (unless one sequence is longer). Sequences of close lengths rarely pair up in a line as long as
# the longest; longer lines pad less, while attention spans more (masked) keys.
LONG_LINE_FACTOR = 4
LONG_LINE_TOKENS = 512


def line_capacity(lengths: list[int]) -> int:
    """The line length to pack into: of 1..``LONG_LINE_FACTOR`` times the longest sequence, the one
    computing the fewest positions, each step up charged 2% (for the longer attention)."""
    longest = max(lengths, default=0)
    best, best_cost = longest, float("inf")
    for k in range(1, LONG_LINE_FACTOR + 1):
        capacity = k * longest
        if k > 1 and capacity > max(LONG_LINE_TOKENS, longest):
            break
        line_of, _, _ = assign_lines(lengths, capacity)
        cost = (max(line_of, default=-1) + 1) * capacity * (1 + 0.02 * (k - 1))
        if cost < best_cost:
            best, best_cost = capacity, cost
    return best


def packed_lines(prompt_P: torch.Tensor, prompt_cu_B1: torch.Tensor, response_T: torch.Tensor,
                 response_cu_B1: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, ...]:
    """Sequences (prompt then response) packed into lines: ``(input_ids_RC, position_ids_RC,
    row_T, pos_T)``, positions restarting at 0 per sequence; ``row_T``/``pos_T`` locate each
    response token (in flat order), as ``PackedBatch.padded`` does for padded rows."""
    prompt_len_B = prompt_cu_B1.diff()
    response_len_B = response_cu_B1.diff()
    lengths = (prompt_len_B + response_len_B).tolist()
    line_of, offset_of, capacity = assign_lines(lengths, line_capacity(lengths))
    num_lines = max(line_of, default=-1) + 1
    line_B, offset_B = torch.tensor(line_of, dtype=torch.long), torch.tensor(offset_of, dtype=torch.long)
    input_ids_RC = torch.full((num_lines, capacity), pad_id, dtype=torch.long)
    position_ids_RC = torch.zeros((num_lines, capacity), dtype=torch.long)

    def place(values: torch.Tensor, cu_B1: torch.Tensor, len_B: torch.Tensor, start_B: torch.Tensor):
        line = torch.repeat_interleave(line_B, len_B)
        within = torch.arange(values.numel()) - torch.repeat_interleave(cu_B1[:-1], len_B).long()
        position = within + torch.repeat_interleave(start_B, len_B)
        col = position + torch.repeat_interleave(offset_B, len_B)
        input_ids_RC[line, col] = values.long()
        position_ids_RC[line, col] = position
        return line, col

    place(prompt_P, prompt_cu_B1, prompt_len_B, torch.zeros_like(prompt_len_B).long())
    row_T, pos_T = place(response_T, response_cu_B1, response_len_B, prompt_len_B.long())
    return input_ids_RC, position_ids_RC, row_T, pos_T

"""Token-budget micro-batches and packed lines: the layouts that make compute follow real tokens.

Pure functions over flat token tensors and offsets (no model, no process group):

* :func:`budget_bounds` splits consecutive rows into micro-batches of at most ``max_tokens`` real
  tokens (verl's ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu``), optionally into at least
  a given number of them (ranks that run collectives per micro-batch must agree on the count);
* :func:`packed_lines` packs a micro-batch's sequences into lines as long as its longest
  sequence (the longest left with the shortest that still fit), with ``position_ids`` restarting
  at 0 per sequence: transformers turns such position ids into a block-causal attention mask, so
  one line holds several sequences that never see each other;
* :func:`shared_prompt_lines` (``actor.use_prefix_grouper``) makes each run of consecutive rows
  with the same prompt (a GRPO group) one segment, the prompt once then every row's response, with
  a block attention mask (each response sees the prompt and its own earlier tokens), so the
  prompt is computed once per group instead of once per row (a group whose one segment would
  spend more on dense attention than its prompt saves is split, each part with the prompt:
  :func:`cheapest_segments`).

Shape letters: B rows, B1 = B + 1 offsets, R packed lines, C line capacity (the longest
sequence), T response tokens of all rows, P prompt tokens of all rows, S segments, X any flat
token values.
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


def _empty_lines(lengths: list[int], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Lines for sequences of ``lengths`` (``assign_lines`` at ``line_capacity``): each sequence's
    line and offset, and the lines' ``input_ids_RC`` (all ``pad_id``) and ``position_ids_RC`` (0)."""
    line_of, offset_of, capacity = assign_lines(lengths, line_capacity(lengths))
    num_lines = max(line_of, default=-1) + 1
    return (torch.tensor(line_of, dtype=torch.long), torch.tensor(offset_of, dtype=torch.long),
            torch.full((num_lines, capacity), pad_id, dtype=torch.long), torch.zeros((num_lines, capacity), dtype=torch.long))


def packed_lines(prompt_P: torch.Tensor, prompt_cu_B1: torch.Tensor, response_T: torch.Tensor,
                 response_cu_B1: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, ...]:
    """Sequences (prompt then response) packed into lines: ``(input_ids_RC, position_ids_RC,
    row_T, pos_T)``, positions restarting at 0 per sequence; ``row_T``/``pos_T`` locate each
    response token (in flat order), as ``PackedBatch.padded`` does for padded rows."""
    prompt_len_B = prompt_cu_B1.diff()
    response_len_B = response_cu_B1.diff()
    line_B, offset_B, input_ids_RC, position_ids_RC = _empty_lines((prompt_len_B + response_len_B).tolist(), pad_id)

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


# What one query-key pair of attention costs against one position's linear layers, times the
# hidden size h: a pair is about 2 h multiply-adds, a position's projections and MLP about 12 h^2
# (1 / (6 h)); step times of two layouts of the 10M benchmark model (CPU) fit 1 / (4.3 h), masked
# attention being slower per multiply-add. Under a dense mask every pair of a line is computed.
PAIR_COST_PER_HIDDEN = 1 / 4


def layout_cost(lengths: list[int], pair_cost: float) -> float:
    """What lines of sequences (segments) of ``lengths`` cost: positions plus ``pair_cost`` per
    query-key pair (``assign_lines`` at ``line_capacity``)."""
    line_of, _, capacity = assign_lines(lengths, line_capacity(lengths))
    num_lines = max(line_of, default=-1) + 1
    return num_lines * capacity * (1 + pair_cost * capacity)


def shared_prompt_segments(prompt_P: torch.Tensor, prompt_cu_B1: torch.Tensor, response_len_B: torch.Tensor | None = None,
                           max_tokens: int = 0, breaks_B: torch.Tensor | None = None) -> torch.Tensor:
    """The segment of each row: a row starts a new one unless its prompt equals the previous row's
    token for token (consecutive GRPO samples of one prompt share a segment) and, with
    ``max_tokens`` > 0, its response still fits the segment's ``max_tokens`` (a row longer than
    that alone). Rows with an empty prompt always start their own, and so do the rows ``breaks_B``
    marks (a vision-language batch: a row whose images differ from the previous row's)."""
    len_B = prompt_cu_B1.diff().long()
    num_rows = len_B.numel()
    starts_B = torch.ones(num_rows, dtype=torch.bool)
    if num_rows > 1:
        same_len = (len_B[1:] == len_B[:-1]) & (len_B[1:] > 0)
        # each prompt token against the token at the same place in the previous row (rows of equal length)
        row_P = torch.repeat_interleave(torch.arange(num_rows), len_B)
        compare_P = same_len[(row_P - 1).clamp(min=0)] & (row_P > 0)
        idx = torch.arange(prompt_P.numel())[compare_P]
        differs = torch.zeros(num_rows, dtype=torch.long)
        differs.index_add_(0, row_P[compare_P], (prompt_P[idx] != prompt_P[idx - len_B[row_P[compare_P]]]).long())
        starts_B[1:] = ~same_len | (differs[1:] > 0)
    if breaks_B is not None:
        starts_B |= breaks_B.bool()
    if max_tokens > 0 and response_len_B is not None:
        used = 0
        for b, (start, p, r) in enumerate(zip(starts_B.tolist(), len_B.tolist(), response_len_B.tolist())):
            if start or used + r > max_tokens:
                starts_B[b], used = True, p
            used += r
    return torch.cumsum(starts_B.long(), 0) - 1


def cheapest_segments(prompt_P: torch.Tensor, prompt_cu_B1: torch.Tensor, response_len_B: torch.Tensor,
                      pair_cost: float, breaks_B: torch.Tensor | None = None) -> torch.Tensor:
    """The segment of each row (:func:`shared_prompt_segments`) under the cheapest bound on a
    segment's tokens (:func:`layout_cost`): none (whole groups, however long; kept on ties), every
    row alone (the per-row layout), or room for 1, 2, 4, ... of the longest response after the
    longest prompt (a long group split, each part with its prompt). Sharing pays where prompts
    are long against the responses; one segment of many long responses can spend more on (dense)
    attention than its prompt saves."""
    plen_B = prompt_cu_B1.diff().long()

    def segment_lengths(seg_B: torch.Tensor) -> list[int]:
        first = torch.cat([torch.ones(min(seg_B.numel(), 1), dtype=torch.bool), seg_B[1:] != seg_B[:-1]])
        rsum = torch.zeros(int(first.sum()), dtype=torch.long).index_add_(0, seg_B, response_len_B.long())
        return (plen_B[first] + rsum).tolist()

    best = shared_prompt_segments(prompt_P, prompt_cu_B1, breaks_B=breaks_B)
    if pair_cost <= 0:
        return best
    whole = segment_lengths(best)
    best_cost = layout_cost(whole, pair_cost)
    longest_prompt = int(plen_B.max()) if plen_B.numel() else 0
    longest_response = int(response_len_B.max()) if plen_B.numel() else 0
    caps, rows = [1], 1  # 1: every row alone (the per-row layout), then room for 1, 2, 4, ... longest responses
    while longest_response > 0 and longest_prompt + rows * longest_response < max(whole, default=0):
        caps.append(longest_prompt + rows * longest_response)
        rows *= 2
    for cap in caps:
        seg_B = shared_prompt_segments(prompt_P, prompt_cu_B1, response_len_B, cap, breaks_B)
        cost = layout_cost(segment_lengths(seg_B), pair_cost)
        if cost < best_cost:
            best, best_cost = seg_B, cost
    return best


def shared_prompt_lines(prompt_P: torch.Tensor, prompt_cu_B1: torch.Tensor, response_T: torch.Tensor,
                        response_cu_B1: torch.Tensor, pad_id: int, pair_cost: float = 0.0,
                        breaks_B: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Segments (one prompt, then the responses of its rows) packed into lines: ``(input_ids_RC,
    position_ids_RC, mask_RCC, row_T, pos_T, pred_T)``.

    Every response's positions continue from its prompt's length (as if it followed the prompt
    alone); ``mask_RCC[r, q, k]`` (True: query ``q`` attends to key ``k``) lets a prompt token see
    the earlier prompt tokens, a response token the prompt and the earlier tokens of its own
    response; segments never see each other, a padding slot sees only itself (no empty softmax
    row). ``row_T``/``pos_T`` locate each response token (flat order); ``pred_T`` is the column
    whose hidden state predicts it: the prompt's last token for a response's first token, else
    the previous token of the same response. With ``pair_cost`` > 0 (a query-key pair's cost
    against a position's, ``PAIR_COST_PER_HIDDEN / hidden_size``) a long group may be split
    (:func:`cheapest_segments`); 0: one segment per group."""
    plen_B, rlen_B = prompt_cu_B1.diff().long(), response_cu_B1.diff().long()
    seg_B = cheapest_segments(prompt_P, prompt_cu_B1, rlen_B, pair_cost, breaks_B)
    num_rows = seg_B.numel()
    first_S = torch.nonzero(torch.cat([torch.ones(min(num_rows, 1), dtype=torch.bool), seg_B[1:] != seg_B[:-1]]))[:, 0]
    num_segments = first_S.numel()
    plen_S = plen_B[first_S]
    rsum_S = torch.zeros(num_segments, dtype=torch.long).index_add_(0, seg_B, rlen_B)
    line_S, offset_S, input_ids_RC, position_ids_RC = _empty_lines((plen_S + rsum_S).tolist(), pad_id)
    segment_RC = torch.full(input_ids_RC.shape, -1, dtype=torch.long)  # -1: padding
    owner_RC = torch.full(input_ids_RC.shape, -1, dtype=torch.long)  # the row of a response token, -1: prompt

    # the prompt of each segment: its first row's prompt tokens
    p_start_S = (prompt_cu_B1[:-1] - prompt_cu_B1[0]).long()[first_S]
    within_p = torch.arange(int(plen_S.sum())) - torch.repeat_interleave(torch.cumsum(plen_S, 0) - plen_S, plen_S)
    seg_p = torch.repeat_interleave(torch.arange(num_segments), plen_S)
    line_p, col_p = line_S[seg_p], offset_S[seg_p] + within_p
    input_ids_RC[line_p, col_p] = prompt_P[p_start_S[seg_p] + within_p].long()
    position_ids_RC[line_p, col_p] = within_p
    segment_RC[line_p, col_p] = seg_p

    # each response after the prompt and the earlier responses of its segment
    r_cu_B = response_cu_B1[:-1].long() - response_cu_B1[0].long()
    before_B = r_cu_B - r_cu_B[first_S][seg_B]  # response tokens of earlier rows of the same segment
    row_T = torch.repeat_interleave(torch.arange(num_rows), rlen_B)
    within_T = torch.arange(response_T.numel()) - r_cu_B[row_T]
    seg_T = seg_B[row_T]
    line_T = line_S[seg_T]
    pos_T = offset_S[seg_T] + plen_S[seg_T] + before_B[row_T] + within_T
    input_ids_RC[line_T, pos_T] = response_T.long()
    position_ids_RC[line_T, pos_T] = plen_S[seg_T] + within_T
    segment_RC[line_T, pos_T] = seg_T
    owner_RC[line_T, pos_T] = row_T
    pred_T = torch.where(within_T == 0, offset_S[seg_T] + plen_S[seg_T] - 1, pos_T - 1)

    return input_ids_RC, position_ids_RC, _block_mask(segment_RC, owner_RC), line_T, pos_T, pred_T


def _block_mask(segment_RC: torch.Tensor, owner_RC: torch.Tensor) -> torch.Tensor:
    """``mask_RCC[r, q, k]``: key ``k`` is at or before query ``q`` in the same segment and is a
    prompt token or a token of the query's own response; every slot sees itself (padding too)."""
    capacity = segment_RC.shape[1]
    cols = torch.arange(capacity)
    causal_CC = cols[None, :] <= cols[:, None]
    same_segment = (segment_RC[:, :, None] == segment_RC[:, None, :]) & (segment_RC[:, :, None] >= 0)
    visible_key = (owner_RC[:, None, :] == -1) | (owner_RC[:, None, :] == owner_RC[:, :, None])
    return (same_segment & visible_key & causal_CC) | torch.eye(capacity, dtype=torch.bool)

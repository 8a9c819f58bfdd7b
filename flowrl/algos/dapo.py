"""DAPO's data-side pieces (https://arxiv.org/abs/2503.14476): overlong reward shaping and the
dynamic-sampling group filter. Pure torch, no I/O.

Shape letters: B = rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["keep_informative_groups", "overlong_penalty"]


def overlong_penalty(
    response_lengths_B: Tensor, *, max_response_length: int, buffer_len: int, penalty_factor: float
) -> Tensor:
    """DAPO's soft overlong punishment, per row: 0 up to ``max_response_length - buffer_len``
    tokens, then falling linearly to ``-penalty_factor`` at ``max_response_length``:
    ``min(-(length - (max - buffer)) / buffer * penalty_factor, 0)`` (verl's ``DAPORewardManager``;
    lengths count the EOS token)."""
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(
            f"overlong buffer_len must be in (0, max_response_length={max_response_length}], got {buffer_len}"
        )
    exceed_B = response_lengths_B.to(torch.float32) - (max_response_length - buffer_len)
    return torch.clamp(-exceed_B / buffer_len * penalty_factor, max=0.0)


def keep_informative_groups(metric_B: Tensor, group_B: Tensor) -> Tensor:
    """Dynamic sampling's filter: True for the rows of groups whose ``metric`` varies (std > 0),
    and of groups of one sample, as verl's ``filter_groups``; a group whose samples all scored
    the same gives every advantage 0 and no gradient, so DAPO drops it and samples more."""
    _, group_of_row_B = torch.unique(group_B, return_inverse=True)
    num_groups = int(group_of_row_B.max()) + 1 if group_of_row_B.numel() else 0
    values_B = metric_B.to(torch.float64)
    lo_G = values_B.new_full((num_groups,), torch.inf).scatter_reduce(0, group_of_row_B, values_B, "amin")
    hi_G = values_B.new_full((num_groups,), -torch.inf).scatter_reduce(0, group_of_row_B, values_B, "amax")
    count_G = torch.bincount(group_of_row_B, minlength=num_groups)
    keep_G = (hi_G > lo_G) | (count_G == 1)
    return keep_G[group_of_row_B]

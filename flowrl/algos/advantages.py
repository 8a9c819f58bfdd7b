"""Advantage estimators: GRPO, RLOO, REINFORCE++ (and its group-baseline form), ReMax, GAE and GPG.

Every estimator has one signature over the experience columns, packed in ``AdvantageInputs``::

    fn(inputs, *, gamma=1.0, lam=1.0, norm_adv_by_std=True) -> (advantages_T, returns_T)

Both results are flat like the inputs and 0 on masked tokens; an estimator ignores the keywords
it has no use for. The registry holds ``Estimator`` objects: the function plus ``needs_values``,
which says whether the estimator needs a critic (``inputs.values_T``), and ``needs_baseline``,
whether it needs a per-row reward baseline (``inputs.reward_baseline_B``, ReMax's greedy
response score), so a graph knows which nodes to build. Call the ``Estimator`` (it checks its
inputs are there) or its ``fn``.

Built-ins are registered by import string in ``flowrl/catalog/algos.py`` (with their traits,
so the config reads them without torch). Adding an estimator is one decorated function; the
config (``algorithm.adv_estimator``) and the graphs find it by name::

    @register_estimator("my_estimator")
    def my_estimator(inputs, *, gamma=1.0, lam=1.0, norm_adv_by_std=True):
        ...
        return advantages_T, returns_T

Numbers follow verl's ``core_algos`` (see notes/peers.md); where flowrl differs, the estimator's
docstring says so.

Shape letters: T = tokens of all rows together, B = rows, B1 = B + 1 offsets, G = groups,
L = the longest row (padded view for the recurrences).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from flowrl.algos.aggregate import segment_ids, segment_sum
from flowrl.catalog.algos import ADVANTAGE_ESTIMATORS
from flowrl.registry import import_string

__all__ = [
    "AdvantageInputs",
    "Estimator",
    "gae_advantages",
    "gpg_advantages",
    "grpo_advantages",
    "optimal_token_baseline_advantages",
    "masked_whiten",
    "broadcast_rows",
    "register_estimator",
    "resolve_estimator",
    "row_scores",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "remax_advantages",
    "rloo_advantages",
    "sum_pi_squared_from_logits",
]

GRPO_EPSILON = 1e-6
WHITEN_EPSILON = 1e-8


@dataclass(frozen=True)
class AdvantageInputs:
    """The experience columns an advantage estimator reads; token-level tensors are flat."""

    token_rewards_T: Tensor
    """Reward per token (float); outcome rewards sit at the row's last valid token."""
    response_mask_T: Tensor
    """1 (or True) on the tokens that are trained on: response tokens, not prompt or tool output."""
    cu_seqlens_B1: Tensor
    """int64 row offsets, length B + 1: row ``i`` is ``[cu[i], cu[i + 1])``."""
    group_B: Tensor
    """int64 group id per row (one per prompt); rows with equal ids form a group, in any order."""
    values_T: Tensor | None = None
    """Critic values per token; only estimators with ``needs_values`` read them."""
    reward_baseline_B: Tensor | None = None
    """A reward baseline per row (ReMax: the score of the prompt's greedy response); only
    estimators with ``needs_baseline`` read it."""
    old_logprobs_T: Tensor | None = None
    """The pre-update log-probs of the sampled tokens (``old_logprobs``); read by
    ``optimal_token_baseline``."""
    sum_pi_squared_T: Tensor | None = None
    """``sum over the vocabulary of pi(v)**2`` at each token (``sum_pi_squared``, from the same
    forward pass as ``old_logprobs``); read by ``optimal_token_baseline``."""

    def __post_init__(self) -> None:
        num_tokens = self.token_rewards_T.numel()
        if self.cu_seqlens_B1.ndim != 1 or self.cu_seqlens_B1.numel() < 1:
            raise ValueError(
                f"cu_seqlens_B1 must be 1-D offsets of length B + 1, got shape {tuple(self.cu_seqlens_B1.shape)}"
            )
        if int(self.cu_seqlens_B1[0]) != 0 or int(self.cu_seqlens_B1[-1]) != num_tokens:
            raise ValueError(
                f"cu_seqlens_B1 must run from 0 to the number of tokens ({num_tokens}), got "
                f"{int(self.cu_seqlens_B1[0])}..{int(self.cu_seqlens_B1[-1])}"
            )
        for name in ("token_rewards_T", "response_mask_T", "values_T", "old_logprobs_T", "sum_pi_squared_T"):
            tensor = getattr(self, name)
            if tensor is not None and (tensor.ndim != 1 or tensor.numel() != num_tokens):
                raise ValueError(
                    f"{name} must be flat with one entry per token ({num_tokens}), got shape {tuple(tensor.shape)}"
                )
        num_rows = self.cu_seqlens_B1.numel() - 1
        if self.group_B.shape != (num_rows,):
            raise ValueError(f"group_B must have one id per row ({num_rows}), got shape {tuple(self.group_B.shape)}")
        if self.reward_baseline_B is not None and self.reward_baseline_B.shape != (num_rows,):
            raise ValueError(
                f"reward_baseline_B must have one value per row ({num_rows}), got shape {tuple(self.reward_baseline_B.shape)}"
            )

    @property
    def num_rows(self) -> int:
        return self.cu_seqlens_B1.numel() - 1


class EstimatorFn(Protocol):
    def __call__(
        self, inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, norm_adv_by_std: bool = True
    ) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class Estimator:
    """A registered advantage estimator: the function and the optional inputs it needs."""

    fn: EstimatorFn
    needs_values: bool = False
    needs_baseline: bool = False

    def __call__(
        self, inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, norm_adv_by_std: bool = True
    ) -> tuple[Tensor, Tensor]:
        if self.needs_values and inputs.values_T is None:
            raise ValueError(
                f"advantage estimator {self.fn.__name__} needs critic values: set AdvantageInputs.values_T "
                "(enable the critic) or choose an estimator without a critic (grpo, rloo, reinforce_plus_plus)"
            )
        if self.needs_baseline and inputs.reward_baseline_B is None:
            raise ValueError(
                f"advantage estimator {self.fn.__name__} needs a reward baseline per row: set "
                "AdvantageInputs.reward_baseline_B (ReMax: the greedy response's score)"
            )
        return self.fn(inputs, gamma=gamma, lam=lam, norm_adv_by_std=norm_adv_by_std)


def register_estimator(name: str, *, needs_values: bool = False, needs_baseline: bool = False):
    """Decorator: register ``fn`` as ``Estimator(fn, needs_values, needs_baseline)`` under
    ``name`` in ``ADVANTAGE_ESTIMATORS`` (``flowrl.catalog.algos``); returns ``fn``, which also
    carries the two traits as attributes, so a config naming it by import string reads them."""

    def decorator(fn: EstimatorFn) -> EstimatorFn:
        ADVANTAGE_ESTIMATORS.register(
            name, Estimator(fn, needs_values=needs_values, needs_baseline=needs_baseline),
            needs_values=needs_values, needs_baseline=needs_baseline,
        )
        fn.needs_values = needs_values  # type: ignore[attr-defined]
        fn.needs_baseline = needs_baseline  # type: ignore[attr-defined]
        return fn

    return decorator


def resolve_estimator(name: str) -> Estimator:
    """The ``Estimator`` that ``algorithm.adv_estimator`` names: a registered name, or an import
    string ``package.module:function`` of a function decorated with ``register_estimator`` (an
    undecorated function with the estimator signature is used as one that needs neither values
    nor a baseline).

    The import-string form is what a run's config uses for an estimator defined outside flowrl:
    every process that computes advantages imports the module itself, so the estimator exists
    wherever the graph runs, with no edits anywhere else.
    """
    if name in ADVANTAGE_ESTIMATORS or ":" not in name:
        return ADVANTAGE_ESTIMATORS.get(name)
    fn = import_string(name)  # importing the module runs its @register_estimator decorators
    if isinstance(fn, Estimator):
        return fn
    if not callable(fn):
        raise ValueError(f"{name!r} is not a function; point it at an advantage estimator function")
    for registered in ADVANTAGE_ESTIMATORS.names():
        estimator = ADVANTAGE_ESTIMATORS.get(registered)
        if estimator.fn is fn:
            return estimator
    return Estimator(fn)


# ---------------------------------------------------------------------------------------------
# helpers


def masked_whiten(x_T: Tensor, mask_T: Tensor) -> Tensor:
    """``(x - mean) * rsqrt(var + 1e-8)`` with mean and Bessel variance over the masked-in tokens.

    As verl's ``masked_whiten``, except that with fewer than two valid tokens (where verl raises)
    the variance is taken as 0, which whitens a single valid token to 0.
    """
    keep_T = mask_T.bool()
    n = keep_T.sum().to(x_T.dtype)
    mean = torch.where(keep_T, x_T, 0).sum() / n.clamp(min=1)
    var = torch.where(keep_T, (x_T - mean).square(), 0).sum() / n.clamp(min=1)
    var = torch.where(n > 1, var * n / (n - 1).clamp(min=1), 0)
    return (x_T - mean) * torch.rsqrt(var + WHITEN_EPSILON)


def _float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.float()


def _row_scores(inputs: AdvantageInputs) -> Tensor:
    """Outcome score per row: the sum of all its token rewards, as verl sums the row."""
    return segment_sum(_float(inputs.token_rewards_T), inputs.cu_seqlens_B1)


def _group_stats(scores_B: Tensor, group_B: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per row: its group's size, mean, Bessel std, and whether all its group's scores are equal."""
    _, group_of_row_B = torch.unique(group_B, return_inverse=True)
    num_groups = int(group_of_row_B.max()) + 1 if group_of_row_B.numel() else 0
    count_G = torch.bincount(group_of_row_B, minlength=num_groups).to(scores_B.dtype)
    mean_G = scores_B.new_zeros(num_groups).index_add(0, group_of_row_B, scores_B) / count_G
    centered_B = scores_B - mean_G[group_of_row_B]
    sq_G = scores_B.new_zeros(num_groups).index_add(0, group_of_row_B, centered_B.square())
    std_G = torch.sqrt(sq_G / (count_G - 1).clamp(min=1))
    lo_G = scores_B.new_full((num_groups,), torch.inf).scatter_reduce(0, group_of_row_B, scores_B, "amin")
    hi_G = scores_B.new_full((num_groups,), -torch.inf).scatter_reduce(0, group_of_row_B, scores_B, "amax")
    return count_G[group_of_row_B], mean_G[group_of_row_B], std_G[group_of_row_B], (lo_G == hi_G)[group_of_row_B]


def _broadcast_rows(x_B: Tensor, inputs: AdvantageInputs) -> Tensor:
    """Row values onto the row's valid tokens, 0 elsewhere."""
    rows_T = segment_ids(inputs.cu_seqlens_B1, inputs.token_rewards_T.numel())
    return torch.where(inputs.response_mask_T.bool(), x_B[rows_T], 0)


def row_scores(inputs: AdvantageInputs) -> Tensor:
    """Outcome score per row (``_B``): the sum of its token rewards. For custom estimators."""
    return _row_scores(inputs)


def broadcast_rows(x_B: Tensor, inputs: AdvantageInputs) -> Tensor:
    """One value per row onto the row's valid tokens (``_T``), 0 elsewhere. For custom estimators."""
    return _broadcast_rows(x_B, inputs)


def _padded_index(cu_seqlens_B1: Tensor, num_tokens: int) -> tuple[Tensor, Tensor, int]:
    """Row and position of every token, and the longest row length L."""
    rows_T = segment_ids(cu_seqlens_B1, num_tokens)
    positions_T = torch.arange(num_tokens, device=cu_seqlens_B1.device) - cu_seqlens_B1[:-1][rows_T]
    lengths_B = cu_seqlens_B1[1:] - cu_seqlens_B1[:-1]
    longest = int(lengths_B.max()) if lengths_B.numel() else 0
    return rows_T, positions_T, longest


def _pad(x_T: Tensor, rows_T: Tensor, positions_T: Tensor, num_rows: int, longest: int) -> Tensor:
    x_BL = x_T.new_zeros(num_rows, longest)
    x_BL[rows_T, positions_T] = x_T
    return x_BL


# ---------------------------------------------------------------------------------------------
# estimators


def grpo_advantages(
    inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, norm_adv_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantage: ``(score - group mean) / (group std + 1e-6)``, Bessel std.

    ``norm_adv_by_std=False`` gives Dr.GRPO's ``score - group mean``. A group of one uses mean 0
    and std 1. A group whose scores are all equal gets exactly 0 (verl gets 0 up to rounding of
    the mean). The row advantage is broadcast to its valid tokens; returns equal advantages.
    ``gamma`` and ``lam`` are unused.
    """
    scores_B = _row_scores(inputs)
    count_B, mean_B, std_B, all_equal_B = _group_stats(scores_B, inputs.group_B)
    single_B = count_B == 1
    mean_B = torch.where(single_B, 0, mean_B)
    adv_B = scores_B - mean_B
    if norm_adv_by_std:
        adv_B = adv_B / (torch.where(single_B, 1, std_B) + GRPO_EPSILON)
    adv_B = torch.where(all_equal_B & ~single_B, 0, adv_B)
    adv_T = _broadcast_rows(adv_B, inputs)
    return adv_T, adv_T


def rloo_advantages(
    inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, norm_adv_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """RLOO: score minus the mean of the other scores of its group, ``(s - mean) * n / (n - 1)``.

    A group of one keeps its raw score. Broadcast to valid tokens; returns equal advantages. The
    keywords are unused.
    """
    scores_B = _row_scores(inputs)
    count_B, mean_B, _, _ = _group_stats(scores_B, inputs.group_B)
    loo_B = (scores_B - mean_B) * count_B / (count_B - 1).clamp(min=1)
    adv_B = torch.where(count_B > 1, loo_B, scores_B)
    adv_T = _broadcast_rows(adv_B, inputs)
    return adv_T, adv_T


def reinforce_plus_plus_advantages(
    inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, norm_adv_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted returns-to-go over each row's valid tokens, whitened over the batch.

    Returns are the unwhitened returns-to-go. Masked tokens are not steps: a return passes through
    them undiscounted and their rewards are ignored, as in verl 0.9 (which carries the running
    return through masked tokens, tool output in multi-turn rows included, so the outcome reward
    reaches the earlier turns). ``lam`` and ``norm_adv_by_std`` are unused.
    """
    rewards_T = _float(inputs.token_rewards_T)
    num_rows, num_tokens = inputs.num_rows, rewards_T.numel()
    rows_T, positions_T, longest = _padded_index(inputs.cu_seqlens_B1, num_tokens)
    rewards_BL = _pad(rewards_T, rows_T, positions_T, num_rows, longest)
    keep_BL = _pad(inputs.response_mask_T.bool(), rows_T, positions_T, num_rows, longest)

    returns_BL = torch.zeros_like(rewards_BL)
    running_B = rewards_BL.new_zeros(num_rows)
    for t in reversed(range(longest)):
        running_B = torch.where(keep_BL[:, t], rewards_BL[:, t] + gamma * running_B, running_B)
        returns_BL[:, t] = running_B

    keep_T = inputs.response_mask_T.bool()
    returns_T = torch.where(keep_T, returns_BL[rows_T, positions_T], 0)
    advantages_T = torch.where(keep_T, masked_whiten(returns_T, keep_T), 0)
    return advantages_T, returns_T


def gae_advantages(
    inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, norm_adv_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation (https://arxiv.org/abs/1506.02438), as verl computes it.

    Masked tokens carry the next value and the running GAE through unchanged (tool output in a
    multi-turn row is not a step). ``returns = advantages + values`` before whitening; the
    advantages are then whitened over the batch's valid tokens. ``norm_adv_by_std`` is unused.
    """
    assert inputs.values_T is not None, "Estimator.__call__ checks values_T"
    rewards_T = _float(inputs.token_rewards_T)
    values_T = inputs.values_T.to(rewards_T.dtype)
    num_rows, num_tokens = inputs.num_rows, rewards_T.numel()
    rows_T, positions_T, longest = _padded_index(inputs.cu_seqlens_B1, num_tokens)
    rewards_BL = _pad(rewards_T, rows_T, positions_T, num_rows, longest)
    values_BL = _pad(values_T, rows_T, positions_T, num_rows, longest)
    keep_BL = _pad(inputs.response_mask_T.bool(), rows_T, positions_T, num_rows, longest)

    advantages_BL = torch.zeros_like(rewards_BL)
    next_value_B = rewards_BL.new_zeros(num_rows)
    running_gae_B = rewards_BL.new_zeros(num_rows)
    for t in reversed(range(longest)):
        keep_B = keep_BL[:, t]
        delta_B = rewards_BL[:, t] + gamma * next_value_B - values_BL[:, t]
        running_gae_B = torch.where(keep_B, delta_B + gamma * lam * running_gae_B, running_gae_B)
        next_value_B = torch.where(keep_B, values_BL[:, t], next_value_B)
        advantages_BL[:, t] = running_gae_B

    keep_T = inputs.response_mask_T.bool()
    advantages_T = advantages_BL[rows_T, positions_T]
    returns_T = torch.where(keep_T, advantages_T + values_T, 0)
    advantages_T = torch.where(keep_T, masked_whiten(advantages_T, keep_T), 0)
    return advantages_T, returns_T


def reinforce_plus_plus_baseline_advantages(
    inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, norm_adv_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (https://arxiv.org/abs/2501.03262): ``score - group mean``, broadcast
    to the row's valid tokens, then whitened over all valid tokens of the batch.

    A group of one uses mean 0. Returns equal advantages (as verl). The keywords are unused.
    """
    scores_B = _row_scores(inputs)
    count_B, mean_B, _, _ = _group_stats(scores_B, inputs.group_B)
    centered_B = scores_B - torch.where(count_B == 1, 0, mean_B)
    keep_T = inputs.response_mask_T.bool()
    adv_T = torch.where(keep_T, masked_whiten(_broadcast_rows(centered_B, inputs), keep_T), 0)
    return adv_T, adv_T


def remax_advantages(
    inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, norm_adv_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """ReMax (https://arxiv.org/abs/2310.10505): undiscounted returns-to-go minus the row's reward
    baseline (the score of its prompt's greedy response), on every valid token; no whitening.

    Masked tokens are not steps (their rewards are ignored, returns pass through), as in
    ``reinforce_plus_plus``. The keywords are unused.
    """
    assert inputs.reward_baseline_B is not None, "Estimator.__call__ checks reward_baseline_B"
    keep_T = inputs.response_mask_T.bool()
    rewards_T = torch.where(keep_T, _float(inputs.token_rewards_T), 0)
    # Returns-to-go within each row: (running sum at the row's last token) - (running sum) + self,
    # in float64 so the running sum over the whole batch loses nothing.
    rows_T = segment_ids(inputs.cu_seqlens_B1, rewards_T.numel())
    running_T = torch.cumsum(rewards_T.double(), 0)
    row_end_B = (inputs.cu_seqlens_B1[1:] - 1).clamp(min=0)
    returns_T = (running_T[row_end_B][rows_T] - running_T + rewards_T.double()).to(rewards_T.dtype)
    returns_T = torch.where(keep_T, returns_T, 0)
    baseline_T = _broadcast_rows(inputs.reward_baseline_B.to(returns_T.dtype), inputs)
    return torch.where(keep_T, returns_T - baseline_T, 0), returns_T


def gpg_advantages(
    inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, norm_adv_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """GPG (https://arxiv.org/abs/2504.02546), verl's ``gpg``: ``alpha * (score - group mean)``
    with ``alpha = rows / rows whose score is non-zero`` (at least 1 in the denominator), counted
    over the whole batch the estimator is given; no std. A group of one uses mean 0 (its raw score
    times alpha). verl's ``f_norm`` is 1. Broadcast to valid tokens; returns equal advantages. The
    keywords are unused.
    """
    scores_B = _row_scores(inputs)
    count_B, mean_B, _, _ = _group_stats(scores_B, inputs.group_B)
    alpha = scores_B.numel() / torch.count_nonzero(scores_B).clamp(min=1)
    adv_B = alpha * (scores_B - torch.where(count_B == 1, 0, mean_B))
    adv_T = _broadcast_rows(adv_B.to(scores_B.dtype), inputs)
    return adv_T, adv_T


def sum_pi_squared_from_logits(logits_TV: Tensor) -> Tensor:
    """``sum_v softmax(logits)_v ** 2`` per row of ``logits_TV`` (float32): the input of
    :func:`optimal_token_baseline_advantages`, as verl's actor computes it
    (``calculate_sum_pi_squared``) from the temperature-scaled logits."""
    return torch.softmax(logits_TV.float(), dim=-1).square().sum(dim=-1)


OTB_EPSILON = 1e-8


def optimal_token_baseline_advantages(
    inputs: AdvantageInputs, *, gamma: float = 1.0, lam: float = 1.0, norm_adv_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """Optimal Token Baseline, verl's ``optimal_token_baseline``: a baseline per prompt group and
    response position ``t``, ``B_t = sum_i G_it W_it / (sum_i W_it + 1e-8)`` over the group's rows
    valid at ``t``, with ``G`` the reward-to-go and ``W_t = sum_{j<=t} (1 - 2 pi_j + sum_v pi_v**2)``
    (``pi_j = exp(old_logprobs)``: the path-variance proxy); ``A = (G - B)`` on valid tokens. A
    group of one keeps ``A = G``; where one row is strictly the group's longest its baseline is 0
    past the second-longest row's length (verl's ``handle_zero_tail``). Returns are ``G`` (0 on
    masked tokens). The keywords are unused (verl's are too)."""
    if inputs.old_logprobs_T is None or inputs.sum_pi_squared_T is None:
        raise ValueError("optimal_token_baseline reads old_logprobs and sum_pi_squared (the actor's pre-update pass "
                         "computes both when algorithm.adv_estimator=optimal_token_baseline); the batch lacks them")
    mask_T = inputs.response_mask_T.to(torch.float64)
    num_tokens, num_rows = mask_T.numel(), inputs.num_rows
    rows_T, positions_T, longest = _padded_index(inputs.cu_seqlens_B1, num_tokens)
    pad = lambda x_T: _pad(x_T.to(torch.float64), rows_T, positions_T, num_rows, longest)  # noqa: E731
    mask_BL = pad(mask_T)
    returns_BL = (pad(inputs.token_rewards_T) * mask_BL).flip(-1).cumsum(-1).flip(-1)
    w_BL = 1 - 2 * torch.exp(pad(inputs.old_logprobs_T)) + pad(inputs.sum_pi_squared_T)
    w_cum_BL = (w_BL * mask_BL).cumsum(-1)
    baselines_BL = torch.zeros_like(returns_BL)
    lengths_B = mask_BL.sum(-1)
    for group in torch.unique(inputs.group_B):
        idx = torch.nonzero(inputs.group_B == group, as_tuple=True)[0]
        if idx.numel() == 1:
            continue
        m, w = mask_BL[idx], w_cum_BL[idx]
        baseline_L = (returns_BL[idx] * w * m).sum(0) / ((w * m).sum(0) + OTB_EPSILON)
        baselines_BL[idx] = baseline_L
        lengths, _ = torch.sort(lengths_B[idx])
        longest_len, second = int(lengths[-1]), int(lengths[-2])
        at_max = torch.nonzero(lengths_B[idx] == longest_len, as_tuple=True)[0]
        if at_max.numel() == 1 and longest_len > second:
            baselines_BL[idx[at_max[0]], second:] = 0.0
    adv_BL = (returns_BL - baselines_BL) * mask_BL
    dtype = inputs.token_rewards_T.dtype if inputs.token_rewards_T.is_floating_point() else torch.float32
    # returns 0 on masked tokens (flowrl's convention; verl leaves a masked token its reward-to-go)
    return adv_BL[rows_T, positions_T].to(dtype), (returns_BL * mask_BL)[rows_T, positions_T].to(dtype)

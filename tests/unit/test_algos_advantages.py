"""Advantage estimators: hand-worked numbers, edge cases, and parity with verl's padded loops.

Shape letters: T = tokens of all rows together, B = rows, B1 = B + 1 offsets, L = padded length.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

from flowrl.algos import ADVANTAGE_ESTIMATORS, AdvantageInputs, Estimator, masked_whiten


def _inputs(rows_rewards, rows_mask, groups, rows_values=None) -> AdvantageInputs:
    """Flat AdvantageInputs from per-row python lists."""
    lengths = [len(r) for r in rows_rewards]
    cu_B1 = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int64)
    flat = lambda rows, dtype: torch.tensor([x for row in rows for x in row], dtype=dtype)  # noqa: E731
    return AdvantageInputs(
        token_rewards_T=flat(rows_rewards, torch.float32),
        response_mask_T=flat(rows_mask, torch.bool),
        cu_seqlens_B1=cu_B1,
        group_B=torch.tensor(groups, dtype=torch.int64),
        values_T=None if rows_values is None else flat(rows_values, torch.float32),
    )


def _close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


# --------------------------------------------------------------------------------------------- GRPO


def test_grpo_hand_worked():
    # rows (group id): r0 (7), r1 (3, alone), r2 (7), r3 (5), r4 (5), r5 (7): groups interleaved.
    # Outcome rewards sit at the last valid token; r2's first token is a prompt token (mask 0).
    inputs = _inputs(
        rows_rewards=[[0, 2], [0, 4], [0, 0, 1], [0, 1], [1], [0, 0]],
        rows_mask=[[1, 1], [1, 1], [0, 1, 1], [1, 1], [1], [1, 1]],
        groups=[7, 3, 7, 5, 5, 7],
    )
    adv_T, ret_T = ADVANTAGE_ESTIMATORS.get("grpo")(inputs)
    # group 7 scores [2, 1, 0]: mean 1, Bessel std sqrt((1 + 0 + 1) / 2) = 1 (population std would
    # be 0.816) -> advantages [1, 0, -1] / (1 + 1e-6).
    # group 3 is a group of one: mean 0, std 1 -> 4 / (1 + 1e-6).
    # group 5 scores [1, 1] are all equal -> 0.
    d = 1 + 1e-6
    expected = [1 / d, 1 / d, 4 / d, 4 / d, 0, 0, 0, 0, 0, 0, -1 / d, -1 / d]
    #           r0        r1        r2 (prompt token 0) r3    r4  r5
    _close(adv_T, expected)
    assert torch.equal(ret_T, adv_T)


def test_grpo_dr_grpo_without_std():
    # Same groups, norm_adv_by_std=False: score - mean; the group of one keeps its raw score.
    inputs = _inputs(
        rows_rewards=[[0, 2], [4], [0, 0]],
        rows_mask=[[1, 1], [1], [1, 1]],
        groups=[0, 1, 0],
    )
    adv_T, _ = ADVANTAGE_ESTIMATORS.get("grpo")(inputs, norm_adv_by_std=False)
    # group 0 scores [2, 0], mean 1 -> [1, -1]; group 1 alone -> 4 - 0 = 4.
    _close(adv_T, [1, 1, 4, -1, -1])


def test_grpo_two_samples_bessel():
    # scores [1, 0]: mean 0.5, Bessel std sqrt(0.25 + 0.25) = sqrt(0.5) -> ±0.5 / (0.70711 + 1e-6) ≈ ±0.70711
    inputs = _inputs([[1], [0]], [[1], [1]], [0, 0])
    adv_T, _ = ADVANTAGE_ESTIMATORS.get("grpo")(inputs)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    _close(adv_T, [a, -a])


def test_grpo_all_equal_group_is_exactly_zero():
    # 0.1 is not representable: a float mean of [0.1, 0.1, 0.1] can differ from 0.1 by one ulp, and
    # that ulp over std + 1e-6 would be ~0.01; an all-equal group must give exactly 0.
    inputs = _inputs([[0.1], [0.1], [0.1]], [[1], [1], [1]], [2, 2, 2])
    adv_T, _ = ADVANTAGE_ESTIMATORS.get("grpo")(inputs)
    assert torch.equal(adv_T, torch.zeros(3))


# --------------------------------------------------------------------------------------------- RLOO


def test_rloo_hand_worked():
    # group 0 scores [1, 0, 2] (n = 3, mean 1): (s - mean) * 3/2 = [0, -1.5, 1.5]
    # (= s minus the mean of the others: 1 - 1, 0 - 1.5, 2 - 0.5). group 1 alone keeps 4.
    inputs = _inputs(
        rows_rewards=[[0, 1], [0], [4], [2]],
        rows_mask=[[1, 1], [1], [1], [1]],
        groups=[0, 0, 1, 0],
    )
    adv_T, ret_T = ADVANTAGE_ESTIMATORS.get("rloo")(inputs)
    _close(adv_T, [0, 0, -1.5, 4, 1.5])
    assert torch.equal(ret_T, adv_T)


# ---------------------------------------------------------------------------------------- REINFORCE++


def test_reinforce_plus_plus_hand_worked():
    # gamma 0.5. r0 rewards [0, 0, 1] -> returns-to-go [0.25, 0.5, 1].
    # r1 = [prompt, 0, 2] with mask [0, 1, 1] -> returns [-, 1, 2].
    # valid returns [0.25, 0.5, 1, 1, 2]: mean 4.75 / 5 = 0.95,
    # centred [-0.7, -0.45, 0.05, 0.05, 1.05], squares sum 1.8, Bessel var 1.8 / 4 = 0.45,
    # advantages = centred / sqrt(0.45 + 1e-8) ≈ [-1.04350, -0.67082, 0.07454, 0.07454, 1.56525].
    inputs = _inputs([[0, 0, 1], [0, 0, 2]], [[1, 1, 1], [0, 1, 1]], [0, 1])
    adv_T, ret_T = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus")(inputs, gamma=0.5)
    _close(ret_T, [0.25, 0.5, 1, 0, 1, 2])
    s = math.sqrt(0.45 + 1e-8)
    _close(adv_T, [-0.7 / s, -0.45 / s, 0.05 / s, 0, 0.05 / s, 1.05 / s])


def test_reinforce_plus_plus_carries_return_through_masked_tokens():
    # Multi-turn row: mask [1, 0, 1] (the middle token is tool output), reward 1 at the end, gamma 0.5.
    # The masked token is not a step: returns [0.5, -, 1] (verl would reset there and give [0, -, 1]).
    # Its reward (7) is ignored.
    inputs = _inputs([[0, 7, 1], [0, 0]], [[1, 0, 1], [1, 1]], [0, 0])
    _, ret_T = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus")(inputs, gamma=0.5)
    _close(ret_T, [0.5, 0, 1, 0, 0])


# ---------------------------------------------------------------------------------------------- GAE


def test_gae_hand_worked():
    # gamma 1, lam 0.5.
    # r0 rewards [0, 0, 1], values [0.1, 0.4, 0.6]:
    #   t2: delta = 1 + 0 - 0.6 = 0.4,        gae = 0.4
    #   t1: delta = 0 + 0.6 - 0.4 = 0.2,      gae = 0.2 + 0.5 * 0.4 = 0.4
    #   t0: delta = 0 + 0.4 - 0.1 = 0.3,      gae = 0.3 + 0.5 * 0.4 = 0.5
    #   returns = gae + values = [0.6, 0.8, 1.0]
    # r1 rewards [0, 0, 1], values [0.5, 9, 0.5], mask [1, 0, 1] (middle token masked):
    #   t2: delta = 1 - 0.5 = 0.5,            gae = 0.5, next value 0.5
    #   t1: masked, carries next value 0.5 and gae 0.5 through (its value 9 is never read)
    #   t0: delta = 0 + 0.5 - 0.5 = 0,        gae = 0 + 0.5 * 0.5 = 0.25
    #   returns [0.75, -, 1.0]
    # valid gae [0.5, 0.4, 0.4, 0.25, 0.5]: mean 0.41, centred [0.09, -0.01, -0.01, -0.16, 0.09],
    # squares sum 0.042, Bessel var 0.0105 -> advantages = centred / sqrt(0.0105 + 1e-8)
    #   ≈ [0.87831, -0.09759, -0.09759, -1.56144, 0.87831]
    inputs = _inputs(
        rows_rewards=[[0, 0, 1], [0, 0, 1]],
        rows_mask=[[1, 1, 1], [1, 0, 1]],
        groups=[0, 0],
        rows_values=[[0.1, 0.4, 0.6], [0.5, 9.0, 0.5]],
    )
    adv_T, ret_T = ADVANTAGE_ESTIMATORS.get("gae")(inputs, gamma=1.0, lam=0.5)
    _close(ret_T, [0.6, 0.8, 1.0, 0.75, 0, 1.0])
    s = math.sqrt(0.0105 + 1e-8)
    _close(adv_T, [0.09 / s, -0.01 / s, -0.01 / s, -0.16 / s, 0, 0.09 / s], atol=1e-4)


def test_gae_discount():
    # gamma 0.5, lam 1, rewards [0, 1], values [0.5, 0.5]:
    #   t1: delta = 1 - 0.5 = 0.5, gae 0.5;  t0: delta = 0.5 * 0.5 - 0.5 = -0.25, gae = -0.25 + 0.5 * 0.5 = 0
    #   returns = [0 + 0.5, 0.5 + 0.5] = [0.5, 1.0]
    inputs = _inputs([[0, 1]], [[1, 1]], [0], rows_values=[[0.5, 0.5]])
    _, ret_T = ADVANTAGE_ESTIMATORS.get("gae")(inputs, gamma=0.5, lam=1.0)
    _close(ret_T, [0.5, 1.0])


def test_gae_needs_values():
    estimator = ADVANTAGE_ESTIMATORS.get("gae")
    assert isinstance(estimator, Estimator) and estimator.needs_values
    assert not any(ADVANTAGE_ESTIMATORS.get(n).needs_values for n in ("grpo", "rloo", "reinforce_plus_plus"))
    with pytest.raises(ValueError, match="values_T"):
        estimator(_inputs([[1]], [[1]], [0]))


# ------------------------------------------------------------------------------------ registry, inputs


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match="gae, gpg, grpo, optimal_token_baseline, reinforce_plus_plus, reinforce_plus_plus_baseline, "
                                         "remax, rloo"):
        ADVANTAGE_ESTIMATORS.get("ppo")


def test_inputs_validation():
    with pytest.raises(ValueError, match="group_B"):
        AdvantageInputs(torch.zeros(3), torch.ones(3), torch.tensor([0, 1, 3]), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="cu_seqlens_B1"):
        AdvantageInputs(torch.zeros(3), torch.ones(3), torch.tensor([0, 1, 4]), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="values_T"):
        AdvantageInputs(torch.zeros(3), torch.ones(3), torch.tensor([0, 3]), torch.zeros(1), values_T=torch.zeros(2))


def test_masked_whiten_single_token_is_zero():
    # verl raises on one valid token; flowrl takes the variance as 0: (5 - 5) * rsqrt(0 + 1e-8) = 0.
    # (The masked token's value, (3 - 5) * 1e4, is never used.)
    whitened = masked_whiten(torch.tensor([5.0, 3.0]), torch.tensor([True, False]))
    assert whitened[0] == 0 and torch.isfinite(whitened).all()
    # No valid token at all: nothing is NaN.
    assert torch.isfinite(masked_whiten(torch.tensor([5.0]), torch.tensor([False]))).all()


# --------------------------------------------------------------------- parity with verl's padded loops


def _random_batch(seed: int):
    """Padded (B, L) rewards/values/mask with right padding, plus the matching flat inputs."""
    g = torch.Generator().manual_seed(seed)
    num_rows, longest = 12, 9
    lengths = torch.randint(1, longest + 1, (num_rows,), generator=g)
    mask_BL = (torch.arange(longest)[None, :] < lengths[:, None]).float()
    rewards_BL = torch.zeros(num_rows, longest)
    rewards_BL[torch.arange(num_rows), lengths - 1] = torch.randint(0, 3, (num_rows,), generator=g).float()
    values_BL = torch.randn(num_rows, longest, generator=g) * mask_BL
    groups = torch.tensor([3, 1, 3, 0, 1, 3, 2, 0, 1, 5, 3, 0])  # sizes 4, 3, 1, 3, 1 (group 2, 5 alone)
    keep = mask_BL.bool()
    inputs = AdvantageInputs(
        token_rewards_T=rewards_BL[keep],
        response_mask_T=keep[keep],
        cu_seqlens_B1=torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]),
        group_B=groups,
        values_T=values_BL[keep],
    )
    return rewards_BL, values_BL, mask_BL, groups, inputs


def _verl_whiten(x, mask):
    mean = (x * mask).sum() / mask.sum()
    var = ((x - mean) ** 2 * mask).sum() / mask.sum()
    var = var * mask.sum() / (mask.sum() - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def _verl_grpo(rewards, mask, index, norm):
    scores = rewards.sum(-1)
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[int(index[i])].append(scores[i])
    out = scores.clone()
    for i in range(len(scores)):
        group = id2score[int(index[i])]
        mean, std = (torch.tensor(0.0), torch.tensor(1.0)) if len(group) == 1 else (
            torch.stack(group).mean(), torch.stack(group).std())
        out[i] = (scores[i] - mean) / (std + 1e-6) if norm else scores[i] - mean
    return out[:, None] * mask


def _verl_rloo(rewards, mask, index):
    scores = rewards.sum(-1)
    id2score = defaultdict(list)
    for i in range(len(scores)):
        id2score[int(index[i])].append(scores[i])
    out = scores.clone()
    for i in range(len(scores)):
        n = len(id2score[int(index[i])])
        if n > 1:
            out[i] = scores[i] * n / (n - 1) - torch.stack(id2score[int(index[i])]).mean() * n / (n - 1)
    return out[:, None] * mask


def _verl_reinforce_pp(rewards, mask, gamma):
    returns = torch.zeros_like(rewards)
    running = 0
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return _verl_whiten(returns, mask) * mask, returns


def _verl_gae(rewards, values, mask, gamma, lam):
    nextvalues, lastgaelam, reversed_adv = 0, 0, []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        reversed_adv.append(lastgaelam)
    adv = torch.stack(reversed_adv[::-1], dim=1)
    return _verl_whiten(adv, mask), adv + values


@pytest.mark.parametrize("seed", [0, 1])
def test_parity_with_verl(seed):
    rewards, values, mask, groups, inputs = _random_batch(seed)
    keep = mask.bool()
    for norm in (True, False):
        adv_T, _ = ADVANTAGE_ESTIMATORS.get("grpo")(inputs, norm_adv_by_std=norm)
        torch.testing.assert_close(adv_T, _verl_grpo(rewards, mask, groups, norm)[keep])
    adv_T, _ = ADVANTAGE_ESTIMATORS.get("rloo")(inputs)
    torch.testing.assert_close(adv_T, _verl_rloo(rewards, mask, groups)[keep])
    adv_T, ret_T = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus")(inputs, gamma=0.9)
    verl_adv, verl_ret = _verl_reinforce_pp(rewards, mask, 0.9)
    torch.testing.assert_close(adv_T, verl_adv[keep])
    torch.testing.assert_close(ret_T, verl_ret[keep])
    adv_T, ret_T = ADVANTAGE_ESTIMATORS.get("gae")(inputs, gamma=0.99, lam=0.95)
    verl_adv, verl_ret = _verl_gae(rewards, values, mask, 0.99, 0.95)
    torch.testing.assert_close(adv_T, verl_adv[keep])
    torch.testing.assert_close(ret_T, verl_ret[keep])

"""The rollout correction (flowrl.algos.rollout_correction) on hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from flowrl.algos.rollout_correction import RolloutCorrection, apply_to_advantages, rollout_importance_weights
from flowrl.metrics import names

# Two rows: row 0 has 2 valid tokens, row 1 has 2 tokens of which the last is padding.
CU = torch.tensor([0, 2, 4])
MASK = torch.tensor([1.0, 1.0, 1.0, 0.0])
LN2, LN3 = math.log(2.0), math.log(3.0)
# old - rollout = [ln 2, -ln 2, ln 3, 5]: token ratios 2, 0.5, 3, (padding)
OLD = torch.tensor([LN2, -LN2, LN3, 5.0])
ROLLOUT = torch.zeros(4)


def test_token_truncate_caps_at_the_threshold():
    # ratios [2, 0.5, 3]; TIS with C = 2.5: [2, 0.5, 2.5], padding 0; the mask is unchanged
    w, mask, m = rollout_importance_weights(OLD, ROLLOUT, MASK, CU, RolloutCorrection(threshold=2.5))
    assert torch.allclose(w, torch.tensor([2.0, 0.5, 2.5, 0.0]))
    assert torch.equal(mask, MASK)
    assert m[names.ROLLOUT_CORR_IS_MAX] == pytest.approx(3.0)  # before truncation
    assert m[names.ROLLOUT_CORR_IS_MIN] == pytest.approx(0.5)
    assert m[names.ROLLOUT_CORR_IS_MEAN] == pytest.approx(5.5 / 3)
    assert m[names.ROLLOUT_CORR_FRACTION_HIGH] == pytest.approx(1 / 3)  # 3 > 2.5
    assert m[names.ROLLOUT_CORR_FRACTION_LOW] == 0.0  # lower = 1/2.5 = 0.4 <= 0.5
    # kl = mean(rollout - old) = -(ln2 - ln2 + ln3)/3 = -ln3/3
    assert m[names.ROLLOUT_CORR_KL] == pytest.approx(-LN3 / 3)
    # k3 = mean(r_exp - r - 1): (2 - ln2 - 1) + (0.5 + ln2 - 1) + (3 - ln3 - 1) = 2.5 - ln3, /3
    assert m[names.ROLLOUT_CORR_K3_KL] == pytest.approx((2.5 - LN3) / 3)
    assert m[names.ROLLOUT_CORR_MASKED_FRACTION] == 0.0


def test_fraction_low_counts_below_the_reciprocal():
    # lower = 1 / 1.5 = 0.667: the ratio 0.5 is below it, 2 and 3 above 1.5
    _, _, m = rollout_importance_weights(OLD, ROLLOUT, MASK, CU, RolloutCorrection(threshold=1.5))
    assert m[names.ROLLOUT_CORR_FRACTION_LOW] == pytest.approx(1 / 3)
    assert m[names.ROLLOUT_CORR_FRACTION_HIGH] == pytest.approx(2 / 3)


def test_token_mask_rejects_outside_the_band():
    # MIS, band [1/2.5, 2.5] = [0.4, 2.5]: 2 and 0.5 stay, 3 leaves the mask; weights stay true ratios
    w, mask, m = rollout_importance_weights(OLD, ROLLOUT, MASK, CU, RolloutCorrection(threshold=2.5, mode="mask"))
    assert torch.allclose(w, torch.tensor([2.0, 0.5, 3.0, 0.0]))
    assert torch.equal(mask, torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert m[names.ROLLOUT_CORR_MASKED_FRACTION] == pytest.approx(1 / 3)


def test_sequence_and_geometric_levels():
    # row 0: sum of log-ratios ln2 - ln2 = 0 -> weight 1 on both tokens; row 1: ln3 -> 3
    w, _, _ = rollout_importance_weights(OLD, ROLLOUT, MASK, CU, RolloutCorrection(threshold=10.0, level="sequence"))
    assert torch.allclose(w, torch.tensor([1.0, 1.0, 3.0, 0.0]))
    # geometric: row 0 mean 0 -> 1; row 1 mean over its one valid token ln3 -> 3; capped at 2
    w, _, _ = rollout_importance_weights(OLD, ROLLOUT, MASK, CU, RolloutCorrection(threshold=2.0, level="geometric"))
    assert torch.allclose(w, torch.tensor([1.0, 1.0, 2.0, 0.0]))
    # sequence-level mask: row 1's weight 3 > 2 removes the whole row
    _, mask, _ = rollout_importance_weights(OLD, ROLLOUT, MASK, CU, RolloutCorrection(threshold=2.0, level="sequence",
                                                                                      mode="mask"))
    assert torch.equal(mask, torch.tensor([1.0, 1.0, 0.0, 0.0]))


def test_veto_rejects_the_row_of_a_catastrophic_token():
    old = torch.tensor([0.0, -12.0, 0.0, 0.0])  # ratio e^-12 < 1e-4 in row 0
    _, mask, m = rollout_importance_weights(old, ROLLOUT, MASK, CU, RolloutCorrection(threshold=2.0, veto_threshold=1e-4))
    assert torch.equal(mask, torch.tensor([0.0, 0.0, 1.0, 0.0]))
    assert m[names.ROLLOUT_CORR_VETO_FRACTION] == 0.5


def test_identical_logprobs_change_nothing_bitwise():
    logp = torch.tensor([-0.3, -1.7, -0.01, -2.2])
    adv = torch.tensor([0.123456789, -1.5, 3.25, 0.0])
    for level in ("token", "sequence", "geometric"):
        w, mask, m = rollout_importance_weights(logp, logp.clone(), MASK, CU, RolloutCorrection(threshold=2.0, level=level))
        assert torch.equal(apply_to_advantages(adv, w), adv)
        assert torch.equal(mask, MASK)
        assert m[names.ROLLOUT_CORR_KL] == 0.0 and m[names.ROLLOUT_CORR_IS_MEAN] == 1.0


def test_weighted_advantages_scale_the_ppo_loss():
    # w * A in vanilla PPO clip (dual clip included) equals w * loss(A): positive homogeneity
    from flowrl.algos import vanilla_policy_loss

    logp, old = torch.tensor([-0.2, -1.0, -0.5, -0.3]), torch.tensor([-0.5, -0.4, -0.5, -0.3])
    adv = torch.tensor([1.0, -2.0, 0.5, 0.7])
    w = torch.tensor([2.0, 0.5, 2.5, 0.0])
    loss_w, _ = vanilla_policy_loss(logp, old, apply_to_advantages(adv, w), MASK, CU)
    loss, _ = vanilla_policy_loss(logp, old, adv, MASK, CU)
    assert torch.allclose(loss_w, loss * torch.tensor([2.0, 0.5, 2.5, 0.0]))

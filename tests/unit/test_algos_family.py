"""The PPO family's pure pieces: REINFORCE++-baseline and ReMax estimators, the estimator registry
as a whole, the clipped value loss, explained variance, the KL reward penalty and its controllers.

Every expected number is worked out by hand in the comment above it.
Shape letters: T = tokens of all rows together, B = rows, B1 = B + 1 offsets, L = padded length.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict

import pytest
import torch

from flowrl.algos import (
    ADVANTAGE_ESTIMATORS,
    AdaptiveKLController,
    AdvantageInputs,
    FixedKLController,
    agg_loss,
    explained_variance,
    kl_penalty_rewards,
    make_kl_controller,
    resolve_estimator,
    value_loss,
)


def _inputs(rows_rewards, rows_mask, groups, rows_values=None, baseline=None) -> AdvantageInputs:
    lengths = [len(r) for r in rows_rewards]
    cu_B1 = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int64)
    flat = lambda rows, dtype: torch.tensor([x for row in rows for x in row], dtype=dtype)  # noqa: E731
    return AdvantageInputs(
        token_rewards_T=flat(rows_rewards, torch.float32),
        response_mask_T=flat(rows_mask, torch.bool),
        cu_seqlens_B1=cu_B1,
        group_B=torch.tensor(groups, dtype=torch.int64),
        values_T=None if rows_values is None else flat(rows_values, torch.float32),
        reward_baseline_B=None if baseline is None else torch.tensor(baseline, dtype=torch.float32),
    )


def _close(actual, expected, atol=1e-4):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-4)


# ------------------------------------------------------------------------ REINFORCE++-baseline


def test_reinforce_plus_plus_baseline_hand_worked():
    # rows (group): r0 (0) rewards [0, 1], r1 (0) [0, 0, 2] with its first token masked (a prompt
    # token), r2 (1, alone) [0.5].
    # scores: r0 = 1, r1 = 2 (the row sum), r2 = 0.5. Group 0 mean 1.5 -> r0 -0.5, r1 +0.5;
    # group 1 has one sample: mean 0 -> r2 +0.5.
    # Broadcast to the 5 valid tokens: [-0.5, -0.5, 0.5, 0.5, 0.5]: mean 0.1, deviations
    # [-0.6, -0.6, 0.4, 0.4, 0.4], Bessel var (0.36 * 2 + 0.16 * 3) / 4 = 0.3, rsqrt = 1.825742
    # -> -0.6 * 1.825742 = -1.095445, 0.4 * 1.825742 = 0.730297; the masked token gets 0.
    inputs = _inputs([[0, 1], [0, 0, 2], [0.5]], [[1, 1], [0, 1, 1], [1]], [0, 0, 1])
    adv_T, ret_T = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus_baseline")(inputs)
    _close(adv_T, [-1.095445, -1.095445, 0.0, 0.730297, 0.730297, 0.730297])
    assert torch.equal(ret_T, adv_T)


def test_reinforce_plus_plus_baseline_parity_with_verl():
    g = torch.Generator().manual_seed(3)
    num_rows, longest = 10, 7
    lengths = torch.randint(1, longest + 1, (num_rows,), generator=g)
    mask_BL = (torch.arange(longest)[None, :] < lengths[:, None]).float()
    rewards_BL = torch.zeros(num_rows, longest)
    rewards_BL[torch.arange(num_rows), lengths - 1] = torch.randint(0, 3, (num_rows,), generator=g).float()
    groups = torch.tensor([0, 1, 0, 2, 1, 0, 3, 1, 2, 0])
    keep = mask_BL.bool()
    inputs = AdvantageInputs(rewards_BL[keep], keep[keep], torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]), groups)
    # verl's compute_reinforce_plus_plus_baseline_outcome_advantage, as a padded loop
    scores = rewards_BL.sum(-1)
    by_group = defaultdict(list)
    for i in range(num_rows):
        by_group[int(groups[i])].append(scores[i])
    mean = {k: torch.tensor(0.0) if len(v) == 1 else torch.stack(v).mean() for k, v in by_group.items()}
    centered = torch.stack([scores[i] - mean[int(groups[i])] for i in range(num_rows)])
    x = centered[:, None] * mask_BL
    m = (x * mask_BL).sum() / mask_BL.sum()
    var = ((x - m) ** 2 * mask_BL).sum() / mask_BL.sum() * mask_BL.sum() / (mask_BL.sum() - 1)
    verl = (x - m) * torch.rsqrt(var + 1e-8) * mask_BL
    adv_T, _ = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus_baseline")(inputs)
    torch.testing.assert_close(adv_T, verl[keep])


# ---------------------------------------------------------------------------------------- ReMax


def test_remax_hand_worked():
    # r0 rewards [0, 1], baseline 0.5: returns-to-go [1, 1] -> advantages [0.5, 0.5].
    # r1 rewards [0, 0, 2] with token 0 masked, baseline 1: returns [masked 0, 2, 2] -> [0, 1, 1].
    # r2 rewards [0.5, 0.25] (two rewards in one row), baseline 0: returns [0.75, 0.25].
    inputs = _inputs([[0, 1], [0, 0, 2], [0.5, 0.25]], [[1, 1], [0, 1, 1], [1, 1]], [0, 0, 1], baseline=[0.5, 1, 0])
    adv_T, ret_T = ADVANTAGE_ESTIMATORS.get("remax")(inputs)
    _close(ret_T, [1, 1, 0, 2, 2, 0.75, 0.25])
    _close(adv_T, [0.5, 0.5, 0, 1, 1, 0.75, 0.25])


def test_remax_needs_a_baseline():
    estimator = ADVANTAGE_ESTIMATORS.get("remax")
    assert estimator.needs_baseline and not estimator.needs_values
    with pytest.raises(ValueError, match="reward_baseline_B"):
        estimator(_inputs([[1]], [[1]], [0]))
    with pytest.raises(ValueError, match="one value per row"):
        _inputs([[1]], [[1]], [0], baseline=[1.0, 2.0])


# ------------------------------------------------------------------------------------ registry


def _any_inputs() -> AdvantageInputs:
    # 4 rows in 2 groups, ragged, a masked token inside row 1; values, baselines and the pre-update
    # pass's log-probs and sum_pi_squared (optimal_token_baseline) for everyone.
    import dataclasses

    inputs = _inputs(
        [[0, 1], [0, 0, 0, 1], [0, 0], [1]],
        [[1, 1], [1, 0, 1, 1], [1, 1], [1]],
        [4, 4, 9, 9],
        rows_values=[[0.1, 0.2], [0.3, 0.4, 0.5, 0.6], [0.0, -0.1], [0.5]],
        baseline=[0.5, 0.5, 0.0, 0.0],
    )
    n = inputs.token_rewards_T.numel()
    return dataclasses.replace(inputs, old_logprobs_T=-torch.linspace(0.1, 2.0, n), sum_pi_squared_T=torch.full((n,), 0.3))


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_every_registered_estimator_runs(name):
    inputs = _any_inputs()
    adv_T, ret_T = ADVANTAGE_ESTIMATORS.get(name)(inputs, gamma=0.9, lam=0.95, norm_adv_by_std=True)
    n = inputs.token_rewards_T.numel()
    assert adv_T.shape == (n,) and ret_T.shape == (n,)
    assert torch.isfinite(adv_T).all() and torch.isfinite(ret_T).all()
    masked = ~inputs.response_mask_T
    assert (adv_T[masked] == 0).all() and (ret_T[masked] == 0).all()
    assert adv_T[~masked].abs().sum() > 0  # the rewards differ, so some advantage is non-zero


def test_the_registry_holds_the_family():
    assert {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"} <= set(ADVANTAGE_ESTIMATORS.names())
    assert [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.get(n).needs_values] == ["gae"]
    assert [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.get(n).needs_baseline] == ["remax"]


def test_resolve_estimator_by_name_and_import_string(tmp_path, monkeypatch):
    # An estimator defined outside flowrl: one decorated function, found by its import string.
    (tmp_path / "outside_estimators.py").write_text(textwrap.dedent('''
        from flowrl.algos import register_estimator

        @register_estimator("test_outside_sign")
        def sign_advantages(inputs, *, gamma=1.0, lam=1.0, norm_adv_by_std=True):
            adv = inputs.token_rewards_T.sign() * inputs.response_mask_T
            return adv, adv
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_estimator("grpo") is ADVANTAGE_ESTIMATORS.get("grpo")
    estimator = resolve_estimator("outside_estimators:sign_advantages")
    assert estimator is ADVANTAGE_ESTIMATORS.get("test_outside_sign")  # the decorator registered it
    adv_T, _ = estimator(_inputs([[0, -2], [3]], [[1, 1], [1]], [0, 0]))
    _close(adv_T, [0, -1, 1])
    with pytest.raises(ValueError, match="no attribute"):
        resolve_estimator("outside_estimators:missing")


# ----------------------------------------------------------------------------------- value loss


def test_value_loss_hand_worked():
    # cliprange 0.5; per token (v, v_old, R):
    #   t0 (1.0, 0, 2): clip(v) = 0.5; (1-2)^2 = 1, (0.5-2)^2 = 2.25 -> 0.5 * 2.25 = 1.125, clipped
    #   t1 (0.2, 0, 0): inside the range; 0.04 both -> 0.02, not clipped
    #   t2 (-1, 0, -2): clip(v) = -0.5; 1 vs 2.25 -> 1.125, clipped
    #   t3 masked
    #   t4 (3, 1, 0): clip(v) = 1.5; 9 vs 2.25 -> 0.5 * 9 = 4.5, not clipped (clipping can't help)
    # vf_clipfrac = 2 / 4, vpred_mean = (1 + 0.2 - 1 + 3) / 4 = 0.8,
    # token-mean loss = (1.125 + 0.02 + 1.125 + 4.5) / 4 = 1.6925
    v = torch.tensor([1.0, 0.2, -1.0, 0.9, 3.0], requires_grad=True)
    old = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0])
    ret = torch.tensor([2.0, 0.0, -2.0, 0.0, 0.0])
    mask = torch.tensor([1, 1, 1, 0, 1])
    loss_T, stats = value_loss(v, old, ret, mask, cliprange_value=0.5)
    _close(loss_T.detach(), [1.125, 0.02, 1.125, 0.0, 4.5])
    _close(stats["vf_clipfrac"], 0.5)
    _close(stats["vpred_mean"], 0.8)
    loss = agg_loss(loss_T, mask, torch.tensor([0, 5]), "token-mean")
    _close(loss.detach(), 1.6925)
    loss.backward()
    # gradient flows only through the larger branch: t0 and t2 are clipped (no gradient to v),
    # t1: d/dv 0.5 (v - R)^2 / 4 = 0.2 / 4 = 0.05; t4: (3 - 0) / 4 = 0.75
    _close(v.grad, [0.0, 0.05, 0.0, 0.0, 0.75])
    with pytest.raises(ValueError, match="cliprange_value"):
        value_loss(v, old, ret, mask, cliprange_value=0.0)


def test_explained_variance_hand_worked():
    # R = [1, 2, 3, 4], v = [1, 2, 3, 3] (the 5th token is masked): R - v = [0, 0, 0, 1]
    # Bessel var(R - v) = (3 * 0.0625 + 0.5625) / 3 = 0.25, Bessel var(R) = 5 / 3
    # 1 - 0.25 / (5/3 + 1e-5) = 0.8500009
    ev = explained_variance(torch.tensor([1.0, 2, 3, 3, 7]), torch.tensor([1.0, 2, 3, 4, 0]), torch.tensor([1, 1, 1, 1, 0]))
    assert ev == pytest.approx(1 - 0.25 / (5 / 3 + 1e-5), abs=1e-9)
    assert explained_variance(torch.ones(4), torch.arange(4.0), torch.ones(4)) == pytest.approx(1 - (5 / 3) / (5 / 3 + 1e-5) , abs=1e-9)
    assert math.isnan(explained_variance(torch.ones(2), torch.ones(2), torch.tensor([1, 0])))


# --------------------------------------------------------------------------- KL reward penalty


def test_kl_penalty_rewards_hand_worked():
    # coef 0.1, k1 = logp - ref.
    # r0: logp [-1, -2], ref [-1.5, -1] -> kl [0.5, -1]; rewards [0, 1] -> [-0.05, 1.1]; row mean -0.25
    # r1: first token masked; logp [-1, -1, -1], ref [-3, -2, -1] -> kl [-, 1, 0];
    #     rewards [0.5, 0, 2] -> [0.5 (masked, kept), -0.1, 2]; row mean 0.5
    # r2: no tokens -> row mean 0.   current KL = (-0.25 + 0.5 + 0) / 3 = 0.083333
    rewards = torch.tensor([0, 1, 0.5, 0, 2])
    logp = torch.tensor([-1.0, -2, -1, -1, -1])
    ref = torch.tensor([-1.5, -1, -3, -2, -1])
    mask = torch.tensor([1, 1, 0, 1, 1])
    cu = torch.tensor([0, 2, 5, 5])
    out_T, kl = kl_penalty_rewards(rewards, logp, ref, mask, cu, coef=0.1, estimator="k1")
    _close(out_T, [-0.05, 1.1, 0.5, -0.1, 2.0])
    assert kl == pytest.approx(0.25 / 3, abs=1e-6)
    # k2 = 0.5 (logp - ref)^2: r0 [0.125, 0.5] -> mean 0.3125; r1 [-, 0.5, 0] -> 0.25; (0.5625) / 3
    _, kl2 = kl_penalty_rewards(rewards, logp, ref, mask, cu, coef=0.1, estimator="k2")
    assert kl2 == pytest.approx(0.5625 / 3, abs=1e-6)


def test_fixed_controller_never_moves():
    ctrl = make_kl_controller("fixed", kl_coef=0.05)
    assert isinstance(ctrl, FixedKLController)
    ctrl.update(current_kl=10.0, n_steps=1000)
    assert ctrl.value == 0.05 and ctrl.state() == {"value": 0.05}


def test_adaptive_controller_hand_worked():
    # value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon; target 0.05, horizon 100
    ctrl = make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.05, horizon=100)
    assert isinstance(ctrl, AdaptiveKLController)
    ctrl.update(0.06, 10)  # error 0.2 -> x 1.02 -> 0.102
    assert ctrl.value == pytest.approx(0.102)
    ctrl.update(0.5, 10)  # error 9 clipped to 0.2 -> x 1.02 -> 0.10404
    assert ctrl.value == pytest.approx(0.10404)
    ctrl.update(0.0, 50)  # error -1 clipped to -0.2 -> x (1 - 0.2 * 0.5) = 0.9 -> 0.093636
    assert ctrl.value == pytest.approx(0.093636)
    ctrl.update(0.045, 100)  # error -0.1 -> x 0.9 -> 0.0842724
    assert ctrl.value == pytest.approx(0.0842724)
    assert ctrl.state() == {"value": pytest.approx(0.0842724), "target_kl": 0.05, "horizon": 100}
    with pytest.raises(ValueError, match="target_kl > 0"):
        AdaptiveKLController(0.1, 0.0, 100)
    with pytest.raises(ValueError, match="unknown KL controller"):
        make_kl_controller("pid", kl_coef=0.1)


# ---------------------------------------------------------------------------------------- DAPO


def test_overlong_penalty_hand_worked():
    from flowrl.algos.dapo import overlong_penalty

    # max 8, buffer 4, factor 1: free up to 8 - 4 = 4 tokens, then -(len - 4) / 4:
    # len 3 -> 0, 4 -> 0, 5 -> -0.25, 6 -> -0.5, 8 -> -1.0;  factor 0.5 halves them
    lengths = torch.tensor([3, 4, 5, 6, 8])
    _close(overlong_penalty(lengths, max_response_length=8, buffer_len=4, penalty_factor=1.0), [0, 0, -0.25, -0.5, -1.0])
    _close(overlong_penalty(lengths, max_response_length=8, buffer_len=4, penalty_factor=0.5), [0, 0, -0.125, -0.25, -0.5])
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(lengths, max_response_length=8, buffer_len=9, penalty_factor=1.0)


def test_keep_informative_groups_hand_worked():
    from flowrl.algos.dapo import keep_informative_groups

    # groups (interleaved): 7 -> scores [1, 0] varies: kept; 3 -> [1, 1] all equal: dropped;
    # 5 -> [0.5] a group of one: kept (as verl); 9 -> [0, 0, 0]: dropped
    metric = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0])
    groups = torch.tensor([7, 3, 7, 3, 5, 9, 9, 9])
    assert keep_informative_groups(metric, groups).tolist() == [True, False, True, False, True, False, False, False]

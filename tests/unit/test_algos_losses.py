"""Policy losses, KL estimators, loss aggregation, log-probs and entropy: hand-worked numbers.

Shape letters: T = tokens of all rows together, B = rows, B1 = B + 1 offsets, N = positions,
V = vocabulary.
"""

from __future__ import annotations

import math

import pytest
import torch

from flowrl.algos import (
    AGG_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    agg_denominator,
    agg_loss,
    entropy_from_logits,
    logprobs_from_logits,
)
from flowrl.algos import logprobs as logprobs_module

E = math.e


def _close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


# ------------------------------------------------------------------------------------ PPO (vanilla)


def _ppo_batch():
    # Two rows of three tokens; row 1's last token is masked.
    old_logp_T = torch.full((6,), -2.0)
    log_ratio_T = torch.tensor([1.0, 1.0, 2.0, -1.0, 30.0, 5.0])
    logp_T = (old_logp_T + log_ratio_T).requires_grad_()
    advantages_T = torch.tensor([1.0, -1.0, -1.0, -1.0, -1.0, 1.0])
    mask_T = torch.tensor([1, 1, 1, 1, 1, 0], dtype=torch.bool)
    cu_B1 = torch.tensor([0, 3, 6])
    return logp_T, old_logp_T, advantages_T, mask_T, cu_B1


def test_vanilla_hand_worked():
    logp_T, old_logp_T, adv_T, mask_T, cu_B1 = _ppo_batch()
    loss_T, stats = POLICY_LOSSES.get("vanilla")(logp_T, old_logp_T, adv_T, mask_T, cu_B1)
    # t0: ratio e,    A=+1: max(-e, -1.2) = -1.2                      clipped
    # t1: ratio e,    A=-1: max(e, 1.2) = e; dual min(3, e) = e        not clipped
    # t2: ratio e^2,  A=-1: max(7.389, 1.2) = 7.389; dual min(3, 7.389) = 3   dual clip active
    # t3: ratio 1/e,  A=-1: max(0.368, 0.8) = 0.8                      clipped (lower bound)
    # t4: log-ratio 30 clamped to 20, ratio e^20, A=-1: dual clip -> 3
    # t5: masked -> 0 (would be -1.2)
    _close(loss_T, [-1.2, E, 3.0, 0.8, 3.0, 0.0])
    # pg_clipfrac = [1, 0, 0, 1, 0] mean = 0.4; pg_clipfrac_lower = [0, 0, 1, 0, 1] mean = 0.4
    # ppo_kl = mean(old - new) over valid tokens, with the clamped log-ratio:
    #        = -(1 + 1 + 2 - 1 + 20) / 5 = -4.6
    _close(stats["pg_clipfrac"], 0.4)
    _close(stats["pg_clipfrac_lower"], 0.4)
    _close(stats["ppo_kl"], -4.6)
    assert all(v.ndim == 0 and not v.requires_grad for v in stats.values())
    # Gradients w.r.t. logp: clipped and dual-clipped tokens have none; t1 has d(-A ratio)/dlogp = ratio = e.
    loss_T.sum().backward()
    _close(logp_T.grad, [0.0, E, 0.0, 0.0, 0.0, 0.0])


def test_vanilla_asymmetric_clip():
    logp_T, old_logp_T, adv_T, mask_T, cu_B1 = _ppo_batch()
    loss_T, _ = POLICY_LOSSES.get("vanilla")(
        logp_T, old_logp_T, adv_T, mask_T, cu_B1, clip_ratio_low=0.1, clip_ratio_high=0.28
    )
    # t0: A=+1 clipped at 1 + 0.28 -> -1.28; t3: A=-1 clipped at 1 - 0.1 -> 0.9
    _close(loss_T[[0, 3]], [-1.28, 0.9])


def test_vanilla_dual_clip_c():
    logp_T, old_logp_T, adv_T, mask_T, cu_B1 = _ppo_batch()
    loss_T, stats = POLICY_LOSSES.get("vanilla")(logp_T, old_logp_T, adv_T, mask_T, cu_B1, clip_ratio_c=10.0)
    # with c = 10: t2 keeps e^2 = 7.389 (< 10); t4 (e^20) is capped at 10; only t4 counts as lower-clipped
    _close(loss_T[[2, 4]], [E**2, 10.0])
    _close(stats["pg_clipfrac_lower"], 0.2)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        POLICY_LOSSES.get("vanilla")(logp_T, old_logp_T, adv_T, mask_T, cu_B1, clip_ratio_c=1.0)


def test_vanilla_positive_advantage_has_no_dual_clip():
    # A=+1 and ratio e^20 (log-ratio 25 clamped to 20): clipped at 1.2, never at -A * c.
    loss_T, stats = POLICY_LOSSES.get("vanilla")(
        torch.tensor([25.0]), torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([True]), torch.tensor([0, 1])
    )
    _close(loss_T, [-1.2])
    _close(stats["pg_clipfrac_lower"], 0.0)
    _close(stats["ppo_kl"], -20.0)


# ---------------------------------------------------------------------------------------------- GSPO


def test_gspo_hand_worked():
    # row 0: log-ratios [0.2, 0.4], A=+1 -> sequence log-ratio mean 0.3, s = e^0.3 = 1.34986
    # row 1: log-ratios [0.1, 5.0 (masked)], A=-1 -> s = e^0.1 = 1.10517 (masked token not counted)
    old_logp_T = torch.full((4,), -1.0)
    logp_T = (old_logp_T + torch.tensor([0.2, 0.4, 0.1, 5.0])).requires_grad_()
    adv_T = torch.tensor([1.0, 1.0, -1.0, -1.0])
    mask_T = torch.tensor([True, True, True, False])
    loss_T, stats = POLICY_LOSSES.get("gspo")(logp_T, old_logp_T, adv_T, mask_T, torch.tensor([0, 2, 4]))
    # row 0: max(-1.34986, -1.2) = -1.2 on both tokens (clipped); row 1: max(1.10517, 1.10517) = 1.10517
    _close(loss_T, [-1.2, -1.2, math.exp(0.1), 0.0])
    # clipfrac 2/3; ppo_kl = -(0.2 + 0.4 + 0.1) / 3; no lower clip in GSPO
    _close(stats["pg_clipfrac"], 2 / 3)
    _close(stats["ppo_kl"], -0.7 / 3)
    _close(stats["pg_clipfrac_lower"], 0.0)
    # each token's gradient flows through its own ratio: d(-A s exp(logp - sg(logp)))/dlogp = -A s
    loss_T.sum().backward()
    _close(logp_T.grad, [0.0, 0.0, math.exp(0.1), 0.0])


def test_gspo_sequence_ratio_clamped_at_10():
    # log-ratio 12 on one token -> sequence log-ratio clamped to 10; A=-1 -> loss = e^10 (no dual clip)
    loss_T, _ = POLICY_LOSSES.get("gspo")(
        torch.tensor([12.0]), torch.tensor([0.0]), torch.tensor([-1.0]), torch.tensor([True]), torch.tensor([0, 1])
    )
    _close(loss_T, [math.exp(10.0)], atol=1e-1)


def test_unknown_policy_loss_lists_valid_names():
    with pytest.raises(ValueError, match="gspo, vanilla"):
        POLICY_LOSSES.get("ppo")


# ------------------------------------------------------------------------------------------------ KL


def test_kl_estimators_hand_worked():
    logp_T = torch.tensor([0.0, -1.0, -30.0, 0.0])
    ref_T = torch.tensor([-1.0, 0.0, 0.0, -30.0])
    # log-ratio logp - ref = [1, -1, -30, 30]
    _close(KL_ESTIMATORS.get("k1")(logp_T, ref_T), [1.0, -1.0, -30.0, 30.0])
    _close(KL_ESTIMATORS.get("abs")(logp_T, ref_T), [1.0, 1.0, 30.0, 30.0])
    _close(KL_ESTIMATORS.get("k2")(logp_T, ref_T), [0.5, 0.5, 450.0, 450.0])
    # k3: x = ref - logp = [-1, 1, 30, -30], clamped to ±20 -> [-1, 1, 20, -20];
    # exp(x) - x - 1 = [e^-1 = 0.36788, e - 2 = 0.71828, e^20 - 21 -> 10, e^-20 + 19 -> 10]
    _close(KL_ESTIMATORS.get("k3")(logp_T, ref_T), [1 / E, E - 2, 10.0, 10.0])


def test_kl_aliases_are_the_same_function():
    assert KL_ESTIMATORS.get("mse") is KL_ESTIMATORS.get("k2")
    assert KL_ESTIMATORS.get("low_var_kl") is KL_ESTIMATORS.get("k3")
    assert KL_ESTIMATORS.get("kl") is KL_ESTIMATORS.get("k1")  # verl's name (actor.kl_loss_type=kl)
    assert KL_ESTIMATORS.get("low_var_kl+") is KL_ESTIMATORS.get("k3+")
    with pytest.raises(ValueError, match="abs, abs\\+, k1, k1\\+, k2"):
        KL_ESTIMATORS.get("full")


@pytest.mark.parametrize("name, base", [("k1+", "k1"), ("abs+", "abs"), ("k3+", "k3"), ("k2+", "k2"), ("mse+", "k2")])
def test_kl_straight_through_value_of_the_estimator_gradient_of_k2(name, base):
    # verl's "+" forms: forward = the base estimator, backward = k2's gradient (logp - ref)
    logp_T = torch.tensor([0.0, -1.0, -2.5, -0.25], requires_grad=True)
    ref_T = torch.tensor([-1.0, 0.0, -0.5, -0.25])
    kl_T = KL_ESTIMATORS.get(name)(logp_T, ref_T)
    torch.testing.assert_close(kl_T, KL_ESTIMATORS.get(base)(logp_T, ref_T), rtol=0, atol=0)
    kl_T.sum().backward()
    # d/dlogp of 0.5 (logp - ref)^2 = logp - ref = [1, -1, -2, 0]
    _close(logp_T.grad, [1.0, -1.0, -2.0, 0.0])


# --------------------------------------------------------------------------------------- aggregation


def _agg_batch():
    # row 0: [1, 2, 3] all valid; row 1: [4, 5, 100] last masked; row 2: [7] fully masked (empty row)
    values_T = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 100.0, 7.0], requires_grad=True)
    mask_T = torch.tensor([1, 1, 1, 1, 1, 0, 0], dtype=torch.bool)
    cu_B1 = torch.tensor([0, 3, 6, 7])
    return values_T, mask_T, cu_B1


def test_agg_modes_hand_worked():
    values_T, mask_T, cu_B1 = _agg_batch()
    # token-mean: (1 + 2 + 3 + 4 + 5) / 5 = 3
    _close(agg_loss(values_T, mask_T, cu_B1, "token-mean"), 3.0)
    # seq-mean-token-sum: (6 + 9) / 2 non-empty rows = 7.5
    _close(agg_loss(values_T, mask_T, cu_B1, "seq-mean-token-sum"), 7.5)
    # seq-mean-token-mean: (6/3 + 9/2) / 2 = (2 + 4.5) / 2 = 3.25
    _close(agg_loss(values_T, mask_T, cu_B1, "seq-mean-token-mean"), 3.25)
    # seq-mean-token-sum-norm with max_response_length 4: (6/4 + 9/4) / 2 = 1.875
    _close(agg_loss(values_T, mask_T, cu_B1, "seq-mean-token-sum-norm", max_response_length=4), 1.875)
    # token-sum: 1 + 2 + 3 + 4 + 5 = 15, whatever the denominator
    _close(agg_loss(values_T, mask_T, cu_B1, "token-sum"), 15.0)
    _close(agg_loss(values_T, mask_T, cu_B1, "token-sum", denominator=7.0), 15.0)
    assert agg_denominator(mask_T, cu_B1, "token-mean") == 5.0
    assert agg_denominator(mask_T, cu_B1, "token-sum") == 0.0
    assert all(agg_denominator(mask_T, cu_B1, m) == 2.0 for m in AGG_MODES.names() if not m.startswith("token-"))


def test_agg_gradient_ignores_masked_tokens():
    values_T, mask_T, cu_B1 = _agg_batch()
    # token-mean: d/dv = 1/5 on valid tokens, 0 on masked ones
    agg_loss(values_T, mask_T, cu_B1, "token-mean").backward()
    _close(values_T.grad, [0.2, 0.2, 0.2, 0.2, 0.2, 0.0, 0.0])
    # a NaN on a masked token does not leak into the loss
    nan_T = torch.tensor([1.0, float("nan")])
    _close(agg_loss(nan_T, torch.tensor([True, False]), torch.tensor([0, 2]), "seq-mean-token-mean"), 1.0)


@pytest.mark.parametrize("mode", AGG_MODES.names())
def test_agg_denominator_splits_micro_batches(mode):
    values_T, mask_T, cu_B1 = _agg_batch()
    kwargs = {"max_response_length": 4}
    whole = agg_loss(values_T, mask_T, cu_B1, mode, **kwargs)
    # micro-batch A = row 0 (tokens 0..3); B = rows 1, 2 (tokens 3..7)
    a = (values_T[:3], mask_T[:3], torch.tensor([0, 3]))
    b = (values_T[3:], mask_T[3:], torch.tensor([0, 3, 4]))
    global_count = agg_denominator(*a[1:], mode) + agg_denominator(*b[1:], mode)  # 5 tokens or 2 rows
    summed = agg_loss(*a, mode, denominator=global_count, **kwargs) + agg_loss(
        *b, mode, denominator=torch.tensor(global_count), **kwargs
    )
    # token-mean: 6/5 + 9/5 = 3 (averaging the local means, (2 + 4.5) / 2 = 3.25, would be wrong)
    # seq-mean-token-mean: 2/2 + 4.5/2 = 3.25
    torch.testing.assert_close(summed, whole)


def test_agg_empty_micro_batch_is_zero_with_a_graph():
    values_T = torch.tensor([3.0, 4.0], requires_grad=True)
    for mode in AGG_MODES.names():
        loss = agg_loss(values_T, torch.zeros(2, dtype=torch.bool), torch.tensor([0, 2]), mode, max_response_length=2)
        assert loss.item() == 0.0 and loss.requires_grad
        loss = agg_loss(values_T, torch.zeros(2, dtype=torch.bool), torch.tensor([0, 2]), mode,
                        denominator=0.0, max_response_length=2)
        assert loss.item() == 0.0


def test_agg_errors():
    values_T, mask_T, cu_B1 = _agg_batch()
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm, token-mean, token-sum"):
        agg_loss(values_T, mask_T, cu_B1, "token-max")
    with pytest.raises(ValueError, match="max_response_length"):
        agg_loss(values_T, mask_T, cu_B1, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="denominator"):
        agg_loss(values_T, mask_T, cu_B1, "token-mean", denominator=-1.0)


# ------------------------------------------------------------------------------ log-probs, entropy


def test_logprobs_and_entropy_hand_worked():
    # row 0: logits [0, 0, ln 2, -inf-ish] -> softmax [1/4, 1/4, 1/2, 0]
    # row 1: uniform over 4 -> entropy ln 4
    logits_NV = torch.tensor([[0.0, 0.0, math.log(2.0), -float("inf")], [1.0, 1.0, 1.0, 1.0]])
    logp_N = logprobs_from_logits(logits_NV, torch.tensor([2, 0]))
    _close(logp_N, [math.log(0.5), math.log(0.25)])
    # entropy row 0: -(2 * 1/4 ln 1/4 + 1/2 ln 1/2) = 0.5 ln 4 + 0.5 ln 2 = 1.03972 (the -inf logit adds 0)
    _close(entropy_from_logits(logits_NV), [0.5 * math.log(4) + 0.5 * math.log(2), math.log(4)])


def test_logprobs_bf16_gives_float32_and_keeps_leading_dims():
    logits_BTV = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    labels_BT = torch.tensor([[0, 1, 2], [3, 4, 0]])
    logp_BT = logprobs_from_logits(logits_BTV, labels_BT)
    assert logp_BT.dtype == torch.float32 and logp_BT.shape == (2, 3)
    expected = torch.log_softmax(logits_BTV.float(), -1).gather(-1, labels_BT[..., None]).squeeze(-1)
    torch.testing.assert_close(logp_BT, expected)
    ent_BT = entropy_from_logits(logits_BTV)
    assert ent_BT.dtype == torch.float32 and ent_BT.shape == (2, 3)
    with pytest.raises(ValueError, match="labels"):
        logprobs_from_logits(logits_BTV, labels_BT[:, :2])


def test_logprobs_and_entropy_gradients_in_chunks(monkeypatch):
    # Force chunks of 2 rows (V = 6 -> 12 elements per chunk) and check the hand-written backward
    # against autograd's numerical gradient.
    monkeypatch.setattr(logprobs_module, "_CHUNK_ELEMENTS", 12)
    g = torch.Generator().manual_seed(0)
    logits_NV = torch.randn(5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    labels_N = torch.randint(0, 6, (5,), generator=g)
    assert torch.autograd.gradcheck(lambda z: logprobs_from_logits(z, labels_N), (logits_NV,))
    assert torch.autograd.gradcheck(entropy_from_logits, (logits_NV,))
    # and against the plain formulas
    reference = torch.log_softmax(logits_NV, -1)
    torch.testing.assert_close(logprobs_from_logits(logits_NV, labels_N), reference.gather(-1, labels_N[:, None])[:, 0])
    torch.testing.assert_close(entropy_from_logits(logits_NV), -(reference.exp() * reference).sum(-1))


def test_entropy_of_large_near_one_hot_logits_is_exact_and_never_negative():
    # |z| ~ 30-60 with one dominant logit: the unshifted lse(z) - E_p[z] cancels two numbers of
    # about max(z) in float32; the shifted form keeps the float64 value to ~1e-7.
    gen = torch.Generator().manual_seed(0)
    z_NV = torch.randn(64, 300, generator=gen) * 3
    z_NV[:, 0] += torch.linspace(20.0, 60.0, 64)
    z64 = z_NV.double()
    exact_N = -(torch.softmax(z64, -1) * torch.log_softmax(z64, -1)).sum(-1)
    ent_N = entropy_from_logits(z_NV)
    assert bool((ent_N >= 0).all())
    torch.testing.assert_close(ent_N.double(), exact_N, rtol=1e-5, atol=1e-5)
    # hand-worked: z = [60, 0]: p = [1 - e^-60, e^-60], H = e^-60 (1 + 60) - ... ~ 61 e^-60 > 0
    two = entropy_from_logits(torch.tensor([[60.0, 0.0]]))
    assert 0.0 <= float(two) < 1e-20
    # the gradient matches float64 autograd of the exact formula
    z_req = z_NV.clone().requires_grad_()
    entropy_from_logits(z_req).sum().backward()
    z64 = z64.requires_grad_()
    (-(torch.softmax(z64, -1) * torch.log_softmax(z64, -1)).sum(-1)).sum().backward()
    torch.testing.assert_close(z_req.grad.double(), z64.grad, rtol=1e-5, atol=1e-6)

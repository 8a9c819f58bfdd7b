"""GMPO (verl's ``geo_mean`` policy loss) and GPG (verl's ``gpg`` estimator and loss): hand-worked
numbers, parity with verl's padded formulas (written out here from verl 0.9.1's ``core_algos``),
the registry entries and verl's keys accepted.

Shape letters: T = tokens of all rows together, B = rows, L = padded row length.
"""

from __future__ import annotations

import contextlib
import io
import math

import pytest
import torch

from flowrl.algos import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, AdvantageInputs, agg_denominator, agg_loss
from flowrl.algos.advantages import gpg_advantages
from flowrl.algos.policy_loss import geo_mean_policy_loss, gpg_policy_loss
from flowrl.catalog.algos import estimator_traits


def _close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


# ------------------------------------------------------------------------------------ GMPO (geo_mean)


def _gmpo_batch():
    # row 0 (A = +1): log-ratios [0.2, 0.6]; row 1 (A = -1): log-ratios [-0.6, 0.1, 9 (masked)]
    old_logp_T = torch.full((5,), -1.0)
    logp_T = (old_logp_T + torch.tensor([0.2, 0.6, -0.6, 0.1, 9.0])).requires_grad_()
    adv_T = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0])
    mask_T = torch.tensor([True, True, True, True, False])
    return logp_T, old_logp_T, adv_T, mask_T, torch.tensor([0, 2, 5])


def test_geo_mean_hand_worked():
    logp_T, old_logp_T, adv_T, mask_T, cu_B1 = _gmpo_batch()
    loss_T, stats = geo_mean_policy_loss(logp_T, old_logp_T, adv_T, mask_T, cu_B1,
                                         clip_ratio_low=0.4, clip_ratio_high=0.4)
    # row 0: clip(d, -0.4, 0.4) = [0.2, 0.4]; A > 0 takes min(d, d_c) = [0.2, 0.4]: mean 0.3,
    #        loss_0 = -1 * e^0.3, spread over 2 tokens: -e^0.3 / 2 each.
    # row 1: clip = [-0.4, 0.1]; A < 0 takes max(d, d_c) = [-0.4, 0.1]: mean -0.15,
    #        loss_1 = +1 * e^-0.15, over 2 valid tokens: e^-0.15 / 2 each; the masked token 0.
    l0, l1 = -math.exp(0.3), math.exp(-0.15)
    _close(loss_T, [l0 / 2, l0 / 2, l1 / 2, l1 / 2, 0.0])
    # clipped tokens: row 0's second (A > 0) and row 1's first (A < 0), out of 4 valid tokens
    _close(stats["pg_clipfrac"], 1 / 4)
    _close(stats["pg_clipfrac_lower"], 1 / 4)
    _close(stats["ppo_kl"], -(0.2 + 0.6 - 0.6 + 0.1) / 4)
    # seq-mean-token-sum gives verl's mean over rows of the row losses
    agg = agg_loss(loss_T, mask_T, cu_B1, "seq-mean-token-sum", denominator=2.0)
    _close(agg, (l0 + l1) / 2)
    # gradients: a clipped token's log-ratio is the constant bound (0); row 0's first token:
    # d(-e^((d0 + 0.4) / 2)) / d d0 = -e^0.3 / 2; row 1's second: d(e^((-0.4 + d1) / 2)) / d d1 = e^-0.15 / 2
    loss_T.sum().backward()
    _close(logp_T.grad, [l0 / 2, 0.0, 0.0, l1 / 2, 0.0])


def _verl_geo_mean(logp, old, adv, mask, low, high):
    """verl 0.9.1's ``compute_policy_loss_geo_mean`` on padded (B, L) tensors."""
    d = logp - old
    sgn = torch.sign(adv)
    d_c = torch.clamp(d, -low, high)
    d_min = sgn * torch.min(sgn * d, sgn * d_c)
    n = mask.sum(-1)
    ratio = torch.exp((d_min * mask).sum(-1) / (n + 1e-8))
    advantage = (adv * mask).sum(-1) / (n + 1e-8)
    return torch.mean(-advantage * ratio)


@pytest.mark.parametrize("seed", [0, 1])
def test_geo_mean_parity_with_verl(seed):
    g = torch.Generator().manual_seed(seed)
    num_rows, longest = 6, 7
    lengths = torch.randint(1, longest + 1, (num_rows,), generator=g)
    mask_BL = (torch.arange(longest)[None, :] < lengths[:, None]).float()
    old_BL = -torch.rand(num_rows, longest, generator=g) * 3
    logp_BL = old_BL + torch.randn(num_rows, longest, generator=g) * 0.5
    adv_BL = torch.randn(num_rows, 1, generator=g).expand(num_rows, longest) * mask_BL
    keep = mask_BL.bool()
    cu_B1 = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    loss_T, _ = POLICY_LOSSES.get("geo_mean")(logp_BL[keep], old_BL[keep], adv_BL[keep], keep[keep], cu_B1,
                                              clip_ratio_low=0.3, clip_ratio_high=0.5)
    mode = "seq-mean-token-sum"
    ours = agg_loss(loss_T, keep[keep], cu_B1, mode, denominator=agg_denominator(keep[keep], cu_B1, mode))
    torch.testing.assert_close(ours, _verl_geo_mean(logp_BL, old_BL, adv_BL, mask_BL, 0.3, 0.5))


# ------------------------------------------------------------------------------------------------ GPG


def test_gpg_loss_is_reinforce():
    logp_T = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    old_logp_T = torch.tensor([-1.5, -2.0, -0.5])
    adv_T = torch.tensor([2.0, -1.0, 3.0])
    mask_T = torch.tensor([True, True, False])
    loss_T, stats = gpg_policy_loss(logp_T, old_logp_T, adv_T, mask_T, torch.tensor([0, 3]))
    # -logp * A: [-(-1) * 2, -(-2) * (-1), masked] = [2, -2, 0]; no ratio, no clip
    _close(loss_T, [2.0, -2.0, 0.0])
    _close(stats["ppo_kl"], (-0.5 + 0.0) / 2)
    _close(stats["pg_clipfrac"], 0.0)
    loss_T.sum().backward()
    _close(logp_T.grad, [-2.0, 1.0, 0.0])


def test_gpg_advantages_hand_worked():
    # rows (group, score): r0 (1, 1), r1 (1, 0), r2 (1, 2), r3 (2, 3: alone), r4 (3, 0), r5 (3, 0);
    # r2's first token is a prompt token; the outcome reward sits at each row's last token.
    rows = [[0, 1], [0], [0, 0, 2], [3], [0, 0], [0]]
    masks = [[1, 1], [1], [0, 1, 1], [1], [1, 1], [1]]
    inputs = AdvantageInputs(
        token_rewards_T=torch.tensor([x for r in rows for x in r], dtype=torch.float32),
        response_mask_T=torch.tensor([x for m in masks for x in m], dtype=torch.bool),
        cu_seqlens_B1=torch.tensor([0, 2, 3, 6, 7, 9, 10]),
        group_B=torch.tensor([1, 1, 1, 2, 3, 3]),
    )
    adv_T, ret_T = ADVANTAGE_ESTIMATORS.get("gpg")(inputs)
    # alpha = 6 rows / 3 non-zero scores = 2. group 1: mean 1 -> 2 * [0, -1, 1];
    # group 2 alone: mean 0 -> 2 * 3 = 6; group 3: mean 0 -> 0
    _close(adv_T, [0, 0, -2, 0, 2, 2, 6, 0, 0, 0])
    assert torch.equal(ret_T, adv_T)


def test_gpg_advantages_all_zero_scores_keep_alpha_finite():
    # no non-zero score: verl clamps the count at 1, so alpha = rows and the advantages are 0
    inputs = AdvantageInputs(token_rewards_T=torch.zeros(3), response_mask_T=torch.ones(3, dtype=torch.bool),
                             cu_seqlens_B1=torch.tensor([0, 1, 2, 3]), group_B=torch.tensor([0, 0, 1]))
    adv_T, _ = gpg_advantages(inputs)
    _close(adv_T, [0.0, 0.0, 0.0])


# ------------------------------------------------------------------------------- registry and keys


def test_registered_under_verls_names():
    assert POLICY_LOSSES.get("geo_mean") is geo_mean_policy_loss
    assert POLICY_LOSSES.get("gpg") is gpg_policy_loss
    assert ADVANTAGE_ESTIMATORS.get("gpg").fn is gpg_advantages
    assert estimator_traits("gpg") == {"needs_values": False, "needs_baseline": False}


@pytest.mark.parametrize("args, expected", [
    (["actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean"], ["actor.policy_loss=geo_mean"]),
    (["algorithm.adv_estimator=gpg", "actor_rollout_ref.actor.policy_loss.loss_mode=gpg"],
     ["actor.policy_loss=gpg", "algorithm.adv_estimator=gpg"]),
])
def test_verl_keys_accepted(args, expected):
    pytest.importorskip("omegaconf")
    from flowrl.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["config", "--from-verl", *args])
    assert rc == 0, err.getvalue()
    for item in expected:
        assert item in out.getvalue()


# ------------------------------------------------------- verl's rollout correction keys (decoupled mode)


def _from_verl(*args: str) -> tuple[int, str, str]:
    pytest.importorskip("omegaconf")
    from flowrl.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["config", "--from-verl", *args])
    return rc, out.getvalue(), err.getvalue()


def test_verl_rollout_is_maps_to_flowrls_truncated_weights():
    rc, out, err = _from_verl("algorithm.rollout_correction.rollout_is=sequence",
                              "algorithm.rollout_correction.rollout_is_threshold=3.0")
    assert rc == 0, err
    for item in ("algorithm.rollout_is=true", "algorithm.rollout_is_level=sequence", "algorithm.rollout_is_threshold=3.0"):
        assert item in out
    # verl's threshold defaults to 2.0; token is flowrl's default level too
    rc, out, err = _from_verl("algorithm.rollout_correction.rollout_is=token")
    assert rc == 0 and "algorithm.rollout_is_threshold=2.0" in out and "rollout_is_level" not in out, (out, err)
    # without rollout_is (verl's null) the threshold alone turns nothing on
    rc, out, _ = _from_verl("algorithm.rollout_correction.rollout_is_threshold=3.0")
    assert rc == 0 and "rollout_is" not in out


@pytest.mark.parametrize("arg, named", [  # decoupled mode's; bypass mode builds them (test_rollout_bypass.py)
    ("algorithm.rollout_correction.rollout_is_threshold=0.5_5.0", "IcePop's lower_upper bounds"),
    ("algorithm.rollout_correction.rollout_is_batch_normalize=true", "built for bypass mode only"),
    ("algorithm.rollout_correction.rollout_rs=token_k1", "built for bypass mode only"),
])
def test_verl_rollout_correction_features_flowrl_lacks_are_refused_by_name(arg, named):
    rc, _, err = _from_verl("algorithm.rollout_correction.rollout_is=token", arg)
    assert rc != 0 and named in err and ("flowrl has no equivalent" in err or "is not built in flowrl" in err), err


def test_geo_mean_with_sequence_weights_is_verls_weighted_row_loss():
    # verl multiplies GMPO's row loss by the geometric mean of the row's weights; a sequence-level
    # weight is one per row, so flowrl's w * A gives the same: loss(w * A) == w * loss(A) per row
    logp_T, old_logp_T, adv_T, mask_T, cu_B1 = _gmpo_batch()
    w_T = torch.tensor([1.5, 1.5, 0.25, 0.25, 0.25])
    weighted_T, _ = geo_mean_policy_loss(logp_T.detach(), old_logp_T, w_T * adv_T, mask_T, cu_B1)
    plain_T, _ = geo_mean_policy_loss(logp_T.detach(), old_logp_T, adv_T, mask_T, cu_B1)
    torch.testing.assert_close(weighted_T, w_T * plain_T)


def test_geo_mean_with_token_weights_is_refused():
    from flowrl.config import ConfigError, load_config

    base = ["actor.policy_loss=geo_mean", "algorithm.rollout_is=true", "algorithm.rollout_is_threshold=2.0"]
    with pytest.raises(ConfigError, match="geometric mean") as err:
        load_config(None, base)
    assert err.value.key == "algorithm.rollout_is_level"
    assert load_config(None, [*base, "algorithm.rollout_is_level=sequence"]).actor.policy_loss == "geo_mean"


@pytest.mark.parametrize("loss", ["geo_mean", "gpg"])
def test_one_update_with_the_loss_moves_the_policy_the_advantages_way(tiny_model_dir, loss):
    import pyarrow as pa

    from flowrl.config import ActorConfig, OptimConfig
    from flowrl.data import experience as ex
    from flowrl.roles.policy import PolicyRole

    table = pa.table({
        "prompt_ids": ex.from_lists([[10, 11, 12]] * 4, ex.TOKEN_IDS),
        "response_ids": ex.from_lists([[20, 21], [22, 23], [20, 21], [22, 23]], ex.TOKEN_IDS),
        "response_mask": ex.from_lists([[1, 1]] * 4, pa.list_(pa.int8())),
        "advantages": ex.from_lists([[1.0, 1.0], [-1.0, -1.0]] * 2, ex.TOKEN_FLOATS),
    })
    actor = ActorConfig(data_parallel_size=1, optim=OptimConfig(lr=1e-3), use_kl_loss=False, policy_loss=loss)
    role = PolicyRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), actor=actor, use_old_logprobs=False)
    before = ex.token_column(role.compute_logprobs(table), "old_logprobs")[0].clone()
    metrics = role.update(table, mini_batch_rows=4)
    delta = (ex.token_column(role.compute_logprobs(table), "old_logprobs")[0] - before).view(4, 2)
    assert bool((delta[[0, 2]] > 0).all()) and bool((delta[[1, 3]] < 0).all()), delta
    assert metrics["actor/pg_clipfrac"] == 0.0 and torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))

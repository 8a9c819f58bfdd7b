"""The rollout correction's bypass mode and rejection sampling (issue 37: verl's
``examples/rollout_correction/*.sh``), against verl 0.9.1's formulas written out in the test on
padded ``(batch, length)`` tensors, as verl's ``rollout_corr_helper`` and
``compute_policy_loss_bypass_mode`` compute them (verl's module needs Ray to import)."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
import torch

from flowrl.algos.actor_loss import ActorLoss, actor_loss
from flowrl.algos.rollout_correction import (Bypass, bypass_policy_loss, is_weights, parse_rs_thresholds,
                                             rejection_keep)
from flowrl.config import ConfigError, load_config

LENGTHS = [5, 3, 0, 7, 4, 6]
BOUND = 20.0


# --------------------------------------------------------------------------- verl's formulas, padded
def padded(flat_T, lengths=LENGTHS):
    B, L = len(lengths), max(lengths)
    out, mask = torch.zeros(B, L, dtype=flat_T.dtype), torch.zeros(B, L)
    pos = 0
    for b, n in enumerate(lengths):
        out[b, :n] = flat_T[pos:pos + n]
        mask[b, :n] = 1
        pos += n
    return out, mask


def flat(x_BL, lengths=LENGTHS):
    return torch.cat([x_BL[b, :n] for b, n in enumerate(lengths)])


def masked_mean(x, m, axis=None):
    return (x * m).sum() / m.sum() if axis is None else (x * m).sum(axis) / (m.sum(axis) + 1e-8)


def verl_is_weights(log_ratio, mask, level, threshold, batch_normalize):
    if isinstance(threshold, str) and "_" in threshold:
        lower, upper = (float(v) for v in threshold.split("_"))
    else:
        lower, upper = None, float(threshold)
    if level == "token":
        raw = torch.exp(torch.clamp(log_ratio, -BOUND, BOUND))
    else:
        s = (log_ratio * mask).sum(-1, keepdim=True)
        raw = torch.exp(torch.clamp(s, -BOUND, BOUND)).expand_as(log_ratio)
    raw = raw * mask
    w = raw.clamp(max=upper) if lower is None else torch.where((raw >= lower) & (raw <= upper), raw, 0)
    if batch_normalize:
        if level == "token":
            mean = masked_mean(w, mask)
        else:
            seq_w = masked_mean(w, mask, axis=-1)
            seq_mask = (mask.sum(-1) > 0).float()
            mean = (seq_w * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        if mean > 1e-8:
            w = w / mean
    return w


def verl_rejection_mask(log_ratio, mask, rs, spec):
    lr = torch.clamp(log_ratio, -BOUND, BOUND)
    ks = {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.exp(lr) - 1.0 - lr}
    combined = torch.ones_like(mask)
    options = [o.strip() for o in rs.split(",")]
    specs = [p.strip() for p in str(spec).split(",")]
    specs = specs * len(options) if len(specs) == 1 else specs
    for option, text in zip(options, specs):
        k = ks[option[-2:]]
        if option.endswith("k1"):
            lo, up = (text.split("_") if "_" in text else (str(1.0 / float(text)), text))
            lo, up = math.log(float(lo)), math.log(float(up))
        else:
            up = float(text)
        if option.startswith("token"):
            stat = k
        elif option.startswith("seq_sum"):
            stat = (k * mask).sum(-1, keepdim=True).expand_as(mask)
        elif option.startswith("seq_mean"):
            stat = masked_mean(k, mask, axis=-1).unsqueeze(-1).expand_as(mask)
        else:
            mx = k.masked_fill(~mask.bool(), float("-inf")).max(-1).values
            stat = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx).unsqueeze(-1).expand_as(mask)
        keep = (stat >= lo) & (stat <= up) if option.endswith("k1") else stat <= up
        combined = combined * keep.float()
    return mask * combined


def verl_bypass_loss(log_prob, rollout, adv, mask, loss_type, level, threshold, batch_normalize, rs, rs_threshold,
                     clip=0.2, clip_c=3.0):
    """verl's compute_policy_loss_bypass_mode with token-mean over the mini-batch's tokens."""
    with torch.no_grad():
        lr = log_prob.detach() - rollout
        w = verl_is_weights(lr, mask, level, threshold, batch_normalize) if level else None
        eff = verl_rejection_mask(lr, mask, rs, rs_threshold) if rs else mask
    num_tokens = mask.sum()
    if loss_type == "reinforce":
        pg = -adv * log_prob * (w if w is not None else 1)
    else:
        ratio = torch.exp(torch.clamp(log_prob - rollout, -BOUND, BOUND))
        l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
        ppo = torch.maximum(l1, l2)
        pg = torch.where(adv < 0, torch.minimum(-adv * clip_c, ppo), ppo)
    return (pg * eff).sum() / num_tokens


# --------------------------------------------------------------------------- data
def sample(seed=0, spread=0.6):
    g = torch.Generator().manual_seed(seed)
    T = sum(LENGTHS)
    rollout = -torch.rand(T, generator=g, dtype=torch.float64) * 2 - 0.05
    logp = rollout + spread * torch.randn(T, generator=g, dtype=torch.float64)
    adv = torch.randn(T, generator=g, dtype=torch.float64)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
    return logp, rollout, adv, torch.ones(T), cu


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [2.0, 1.3, "0.5_2.0", "0.8_1.25"])
@pytest.mark.parametrize("batch_normalize", [False, True])
def test_importance_weights_equal_verls(level, threshold, batch_normalize):
    logp, rollout, _, mask, cu = sample(1, spread=0.3 if level == "token" else 0.15)
    w_T, metrics = is_weights(logp - rollout, mask, cu, level=level, threshold=threshold, batch_normalize=batch_normalize)
    lr_BL, mask_BL = padded(logp - rollout)
    expected = verl_is_weights(lr_BL, mask_BL, level, threshold, batch_normalize)
    torch.testing.assert_close(w_T, flat(expected), rtol=1e-12, atol=1e-12)
    assert ("rollout_corr/rollout_is_batch_norm_factor" in metrics) == batch_normalize
    if batch_normalize and level == "token":
        assert float(w_T.mean()) == pytest.approx(1.0)


@pytest.mark.parametrize("rs,spec", [
    ("token_k1", "0.6_1.6"), ("token_k1", "1.5"), ("token_k2", "0.05"), ("token_k3", "0.04"),
    ("seq_sum_k1", "0.5_2.0"), ("seq_sum_k2", "0.3"), ("seq_sum_k3", "0.2"), ("seq_mean_k1", "0.8_1.25"),
    ("seq_mean_k2", "0.05"), ("seq_mean_k3", "0.05"), ("seq_max_k2", "0.2"), ("seq_max_k3", "0.15"),
    ("token_k1,seq_max_k2", "0.6_1.6,2.5"), ("token_k1,seq_max_k2", "0.6_1.6,0.2"), ("seq_sum_k2,token_k3", "0.3"),
])
def test_rejection_sampling_equals_verls(rs, spec):
    logp, rollout, _, mask, cu = sample(2, spread=0.4)
    keep_T, metrics = rejection_keep(logp - rollout, mask, cu, rs, spec)
    lr_BL, mask_BL = padded(logp - rollout)
    expected = flat(verl_rejection_mask(lr_BL, mask_BL, rs, spec)).bool()
    assert torch.equal(keep_T, expected)
    assert 0 < int(keep_T.sum()) or "0.2" in spec or "0.05" in spec  # most cases keep something
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 - float(expected.float().mean()))


CASES = [  # verl's two catalogue scripts, and variations
    dict(loss_type="reinforce", level="sequence", threshold=2.0, batch_normalize=True, rs=None, rs_threshold=None),
    dict(loss_type="ppo_clip", level="token", threshold=2.0, batch_normalize=False, rs="token_k1,seq_max_k2",
         rs_threshold="0.6_1.6,2.5"),
    dict(loss_type="ppo_clip", level="token", threshold=2.0, batch_normalize=False, rs="token_k1",
         rs_threshold="0.7_1.4"),
    dict(loss_type="reinforce", level="token", threshold="0.5_2.0", batch_normalize=True, rs="seq_mean_k3",
         rs_threshold="0.05"),
    dict(loss_type="reinforce", level=None, threshold=2.0, batch_normalize=False, rs=None, rs_threshold=None),
]


@pytest.mark.parametrize("case", CASES)
def test_bypass_loss_and_gradient_equal_verls(case):
    logp0, rollout, adv, mask, cu = sample(3, spread=0.3)
    spec = ActorLoss(policy_loss=lambda *a, **k: bypass_policy_loss(*a, bypass=Bypass(**case), **k),
                     kl_estimator=lambda a, b: a - b, mode="token-mean", max_response_length=8, use_old_logprobs=True,
                     clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, entropy_coeff=0.0, use_kl_loss=False,
                     kl_loss_coef=0.0)
    logp = logp0.clone().requires_grad_(True)
    fields = {"advantages": adv, "response_mask": mask, "old_logprobs": rollout}
    loss, stats = actor_loss(logp, None, fields, cu, spec=spec, denominator=float(mask.sum()))
    loss.backward()
    logp_BL = padded(logp0)[0].clone().requires_grad_(True)
    expected = verl_bypass_loss(logp_BL, padded(rollout)[0], padded(adv)[0], padded(mask)[1], **case)
    expected.backward()
    assert float(loss) == pytest.approx(float(expected), rel=1e-10, abs=1e-12)
    torch.testing.assert_close(logp.grad, flat(logp_BL.grad), rtol=1e-10, atol=1e-12)
    if case["rs"]:
        assert "rollout_corr/rollout_rs_masked_fraction" in stats
    if case["level"]:
        assert "rollout_corr/rollout_is_mean" in stats


def test_the_ppo_clip_gradient_is_the_plain_policy_gradient_on_policy():
    # logp == rollout (nothing stale): PPO clip's ratio is 1 and bypass mode is REINFORCE's gradient
    _, rollout, adv, mask, cu = sample(4)
    grads = []
    for loss_type in ("ppo_clip", "reinforce"):
        logp = rollout.clone().requires_grad_(True)
        loss_T, _ = bypass_policy_loss(logp, rollout, adv, mask, cu, bypass=Bypass(loss_type=loss_type))
        loss_T.sum().backward()
        grads.append(logp.grad.clone() * (torch.exp(logp.detach()) if loss_type == "reinforce" else 1))
    # d/dlogp of -A*exp(logp - rollout) at logp = rollout is -A; of -A*logp is -A as well
    torch.testing.assert_close(grads[0], -adv)


def test_thresholds_parse_as_verls_and_bad_ones_name_the_fix():
    assert parse_rs_thresholds("token_k1,seq_max_k2", "0.6_1.6,2.5") == {"token_k1": (0.6, 1.6),
                                                                         "seq_max_k2": (None, 2.5)}
    assert parse_rs_thresholds("token_k1", 2.0) == {"token_k1": (0.5, 2.0)}
    for rs, spec, match in (("token_k4", "1", "unknown option"), ("token_k1,token_k2", "1,2,3", "one each"),
                            ("seq_max_k2", "0.5_2", "one positive float"), ("token_k1", None, "needs")):
        with pytest.raises(ValueError, match=match):
            parse_rs_thresholds(rs, spec)


# --------------------------------------------------------------------------- config, graph, verl's keys
def test_bypass_mode_config_and_its_refusals():
    cfg = load_config(None, ["algorithm.rollout_is_bypass=true", "algorithm.rollout_is=true",
                             "algorithm.rollout_is_threshold=2.0", "algorithm.rollout_is_loss_type=reinforce",
                             "algorithm.rollout_rs=token_k1", "algorithm.rollout_rs_threshold=0.5_2.0"])
    assert cfg.needs_old_logprobs
    from flowrl.config.rollout_bypass import bypass_settings

    assert bypass_settings(cfg.algorithm) == {"loss_type": "reinforce", "level": "token", "threshold": 2.0,
                                              "batch_normalize": False, "rs": "token_k1", "rs_threshold": "0.5_2.0"}
    for args, match in (
        (["algorithm.rollout_rs=token_k1", "algorithm.rollout_rs_threshold=0.5_2.0"], "bypass mode only"),
        (["algorithm.rollout_is_bypass=true", "algorithm.rollout_rs=token_k9", "algorithm.rollout_rs_threshold=1"],
         "unknown option"),
        (["algorithm.rollout_is_bypass=true", "algorithm.rollout_is_loss_type=dpo"], "rollout_is_loss_type"),
        (["algorithm.rollout_is_bypass=true", "actor.policy_loss=gspo"], "replaced in bypass mode"),
        (["algorithm.rollout_is_bypass=true", "algorithm.rollout_is_batch_normalize=true"], "rollout_is is off"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_config(None, args)


def test_bypass_graph_has_no_old_logprob_pass_and_no_decoupled_node():
    from test_graph_async import PROMPTS, _ctx, _deps

    from flowrl.graphs.family import resolve_family
    from flowrl.nodes.bypass import rollout_as_old_logprobs
    from flowrl.roles.specs import actor_spec

    cfg = load_config(None, ["algorithm.rollout_is_bypass=true", "algorithm.rollout_is=true",
                             "algorithm.rollout_is_threshold=2.0", "actor.use_kl_loss=false"])
    def actor_calls(cfg):
        ctx = _ctx(cfg)
        before = ctx.groups["actor"].reserve()
        deps = _deps(*resolve_family(cfg)(cfg).build(ctx, PROMPTS, step=0).outputs)
        return deps, ctx.groups["actor"].reserve() - before - 1

    deps, calls = actor_calls(cfg)
    assert "rollout_corr" not in deps and "old_log_prob" in deps["adv"]
    assert calls == 2  # the update and the weight sync: no log-prob call
    decoupled = load_config(None, ["algorithm.rollout_is=true", "algorithm.rollout_is_threshold=2.0",
                                   "actor.use_kl_loss=false"])
    assert actor_calls(decoupled)[1] == 3 and "bypass" not in actor_spec(decoupled).role_kwargs
    assert actor_spec(cfg).role_kwargs["bypass"]["level"] == "token"
    table = pa.table({"rollout_logprobs": pa.array([[-0.5, -1.0]], pa.list_(pa.float32()))})
    assert rollout_as_old_logprobs(table).value.column("old_logprobs").to_pylist() == [[-0.5, -1.0]]


def _verl(args):
    from flowrl.config.verl_hydra import flags_first
    from flowrl.cli import _split_config_args, build_parser
    from flowrl.config.loader import load_config_with_notes

    ns = build_parser().parse_args(flags_first(["config", "--from-verl", *args]))
    return load_config_with_notes(*_split_config_args(ns.items, ns))[0]


def test_verls_rollout_correction_keys_map():
    p = "algorithm.rollout_correction."
    a = _verl([f"{p}rollout_is=sequence", f"{p}rollout_is_threshold=2.0", f"{p}rollout_is_batch_normalize=true",
               f"{p}rollout_rs=null", f"{p}rollout_rs_threshold=null", f"{p}bypass_mode=true",
               f"{p}loss_type=reinforce"]).algorithm
    assert (a.rollout_is_bypass, a.rollout_is_loss_type, a.rollout_is_level, a.rollout_is_threshold,
            a.rollout_is_batch_normalize, a.rollout_rs) == (True, "reinforce", "sequence", 2.0, True, None)
    b = _verl([f"{p}rollout_is=token", f"{p}rollout_rs='token_k1,seq_max_k2'", f"{p}rollout_rs_threshold='0.6_1.6,2.5'",
               f"{p}bypass_mode=true", f"{p}rollout_is_threshold=0.5_2.0"]).algorithm
    assert (b.rollout_rs, b.rollout_rs_threshold, b.rollout_is_mode, b.rollout_is_threshold_lower,
            b.rollout_is_threshold) == ("token_k1,seq_max_k2", "0.6_1.6,2.5", "mask", 0.5, 2.0)
    from flowrl.config.rollout_bypass import bypass_settings

    assert bypass_settings(b)["threshold"] == "0.5_2.0"  # IcePop, as verl
    # decoupled mode: rejection sampling, batch normalization and IcePop are refused by name
    for extra in ([f"{p}rollout_rs=token_k1", f"{p}rollout_rs_threshold=0.5_2.0"],
                  [f"{p}rollout_is_batch_normalize=true"], [f"{p}rollout_is_threshold=0.5_2.0"]):
        with pytest.raises(ConfigError, match="is not built in flowrl|flowrl has no equivalent"):
            _verl([f"{p}rollout_is=token", *extra])

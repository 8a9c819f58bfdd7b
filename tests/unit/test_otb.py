"""verl's Optimal Token Baseline (``algorithm.adv_estimator=optimal_token_baseline``, issue 37):
the estimator against verl 0.9.1's ``compute_optimal_token_baseline_advantage`` written out in the
test on padded ``(batch, length)`` tensors (verl's module needs Ray to import), and the actor's
``sum_pi_squared`` against the model's own softmax."""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa
import pytest
import torch

from flowrl.algos.advantages import (AdvantageInputs, optimal_token_baseline_advantages, resolve_estimator,
                                     sum_pi_squared_from_logits)
from flowrl.config import ConfigError, load_config
from flowrl.data import experience as ex


def verl_otb(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, epsilon=1e-8):
    """verl 0.9.1's compute_optimal_token_baseline_advantage (handle_zero_tail=True, no IS weights)."""
    batch_size, _ = token_level_rewards.shape
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    w_per_timestep = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    w_cumulative = (w_per_timestep * response_mask).cumsum(dim=-1)
    prompt_groups = defaultdict(list)
    for i in range(batch_size):
        prompt_groups[index[i]].append(i)
    baselines = torch.zeros_like(returns)
    for _, idx in prompt_groups.items():
        if len(idx) == 1:
            continue
        t = torch.tensor(idx)
        r, w, m = returns[t], w_cumulative[t], response_mask[t]
        baselines[t] = ((r * w * m).sum(0) / ((w * m).sum(0) + epsilon)).unsqueeze(0).expand(len(idx), -1)
        lengths = m.sum(-1)
        srt, _ = torch.sort(lengths)
        mx, second = int(srt[-1]), int(srt[-2])
        at = (lengths == mx).nonzero(as_tuple=True)[0]
        if at.numel() == 1 and mx > second:
            baselines[idx[int(at[0])], second:] = 0.0
    return (returns - baselines) * response_mask, returns


def _case(seed, lengths, groups):
    g = torch.Generator().manual_seed(seed)
    B, L = len(lengths), max(lengths)
    mask = torch.zeros(B, L, dtype=torch.float64)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    rewards = torch.zeros(B, L, dtype=torch.float64)
    for b, n in enumerate(lengths):
        if n:
            rewards[b, n - 1] = float(torch.randint(0, 2, (1,), generator=g))
        rewards[b, :n] += 0.01 * torch.randn(n, generator=g, dtype=torch.float64)  # token rewards too (KL in reward)
    old = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3
    pi2 = torch.rand(B, L, generator=g, dtype=torch.float64) * 0.5 + 0.1
    return rewards * mask, mask, old * mask, pi2 * mask, torch.tensor(groups)


def _flat(x_BL, lengths):
    return torch.cat([x_BL[b, :n] for b, n in enumerate(lengths)])


@pytest.mark.parametrize("lengths,groups", [
    ([5, 3, 7, 7, 2, 6], [0, 0, 0, 1, 1, 2]),  # group 2 of one; group 1 with a unique longest row
    ([4, 4, 4, 4], [0, 0, 0, 0]),  # equal lengths: no zero tail
    ([1, 9, 3, 9, 2, 8, 8, 0], [3, 3, 3, 3, 7, 7, 7, 7]),  # a tie for the longest; an empty row
    ([12, 2, 5, 3, 11, 4], [0, 1, 0, 1, 0, 1]),  # interleaved groups
])
def test_otb_equals_verls(lengths, groups):
    rewards, mask, old, pi2, group_B = _case(len(lengths), lengths, groups)
    expected_adv, expected_ret = verl_otb(rewards, mask, groups, old, pi2)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    inputs = AdvantageInputs(token_rewards_T=_flat(rewards, lengths), response_mask_T=_flat(mask, lengths),
                             cu_seqlens_B1=cu, group_B=group_B, old_logprobs_T=_flat(old, lengths),
                             sum_pi_squared_T=_flat(pi2, lengths))
    adv_T, ret_T = resolve_estimator("optimal_token_baseline")(inputs, gamma=1.0, lam=1.0, norm_adv_by_std=True)
    torch.testing.assert_close(adv_T, _flat(expected_adv, lengths), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret_T, _flat(expected_ret, lengths), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="old_logprobs and sum_pi_squared"):
        optimal_token_baseline_advantages(AdvantageInputs(
            token_rewards_T=inputs.token_rewards_T, response_mask_T=inputs.response_mask_T, cu_seqlens_B1=cu,
            group_B=group_B))


def test_sum_pi_squared_from_the_actors_pass(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from flowrl.backends.train.dp_policy import TorchDPEngine
    from flowrl.data.packed import PackedBatch

    logits = torch.randn(7, 11, dtype=torch.float64)
    torch.testing.assert_close(sum_pi_squared_from_logits(logits),
                               (torch.softmax(logits.float(), -1) ** 2).sum(-1))
    prompts, responses = [[3, 4, 5], [6, 7]], [[8, 9, 10, 11], [12, 13, 14]]
    table = pa.table({"prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
                      "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
                      "response_mask": ex.from_lists([[1] * 4, [1] * 3], pa.list_(pa.int8()))})
    engine = TorchDPEngine(str(tiny_model_dir), trainable=False)
    logp_T, pi2_T = engine.forward_logprobs(PackedBatch.from_table(table), micro_batch_size=2, temperature=0.7,
                                            with_entropy=True, token_stat="sum_pi_squared")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    expected = []
    with torch.no_grad():
        for p, r in zip(prompts, responses):
            logits = model(torch.tensor([p + r])).logits[0, len(p) - 1:-1].float() / 0.7
            expected.append((torch.softmax(logits, -1) ** 2).sum(-1))
    torch.testing.assert_close(pi2_T, torch.cat(expected), rtol=1e-4, atol=1e-5)
    assert logp_T.shape == pi2_T.shape


def test_config_needs_the_pre_update_pass_and_refuses_what_cannot_feed_it():
    cfg = load_config(None, ["algorithm.adv_estimator=optimal_token_baseline"])
    assert cfg.needs_old_logprobs  # one optimizer step per batch: the pass still runs, for W and pi2
    for extra, match in ((["actor.strategy=megatron"], "actor.strategy=megatron does not compute"),
                         (["algorithm.rollout_is=true", "algorithm.rollout_is_threshold=2"], "squared"),
                         (["algorithm.rollout_is_bypass=true"], "bypass mode")):
        with pytest.raises(ConfigError, match=match):
            load_config(None, ["algorithm.adv_estimator=optimal_token_baseline", *extra])


def test_the_advantages_node_feeds_the_estimator():
    from flowrl.nodes.advantages import advantages

    lengths = [3, 2, 4]
    table = pa.table({
        "token_rewards": ex.from_lists([[0, 0, 1.0], [0, 0.0], [0, 0, 0, 1.0]], ex.TOKEN_FLOATS),
        "response_mask": ex.from_lists([[1] * n for n in lengths], pa.list_(pa.int8())),
        "group": pa.array([0, 0, 0], pa.int64()),
    })
    cols = pa.table({"old_logprobs": ex.from_lists([[-0.5] * n for n in lengths], ex.TOKEN_FLOATS),
                     "sum_pi_squared": ex.from_lists([[0.3] * n for n in lengths], ex.TOKEN_FLOATS)})
    out = advantages(table, cols, estimator="optimal_token_baseline", gamma=1.0, lam=1.0, norm_adv_by_std=True)
    adv = out.column("advantages").to_pylist()
    r = torch.zeros(3, 4, dtype=torch.float64)
    r[0, 2], r[2, 3] = 1.0, 1.0
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    expected, _ = verl_otb(r, m, [0, 0, 0], torch.full((3, 4), -0.5, dtype=torch.float64) * m,
                           torch.full((3, 4), 0.3, dtype=torch.float64) * m)
    for b, n in enumerate(lengths):
        assert adv[b] == pytest.approx(expected[b, :n].tolist(), abs=1e-6)

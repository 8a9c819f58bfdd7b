"""The supervised losses (SFT, DPO) on fixed inputs: values worked out by hand or from TRL's
``DPOTrainer`` formulas written out here in plain Python (not TRL's code), and micro-batches that
sum to the whole."""

from __future__ import annotations

import math

import pytest
import torch

from flowrl.algos.dpo_loss import DPO_LOSS, dpo_loss
from flowrl.algos.sft_loss import SFT_LOSS, sft_loss
from flowrl.algos.supervised import Totals, means


def _cu(*lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])


def test_sft_loss_is_the_mean_nll_of_the_masked_tokens_and_micro_batches_sum_to_it():
    logp = torch.tensor([-1.0, -2.0, -3.0, -0.5])
    fields = {"response_mask": torch.tensor([1, 0, 1, 1], dtype=torch.int8)}
    cu = _cu(2, 2)
    # masked tokens: 1 + 3 + 0.5 over 3 = 1.5 (the -2.0 token is not the assistant's)
    totals = Totals(SFT_LOSS.count(fields, cu))
    loss, sums = sft_loss(logp, fields, cu, totals=totals)
    assert totals.denominator == 3.0 and loss.item() == pytest.approx(1.5)
    assert means(sums, totals) == {"sft_loss": pytest.approx(1.5)}
    # two micro-batches of one row: 1/3 + 3.5/3; their sums 1 and 3.5 over 3 make the same mean
    l0, s0 = sft_loss(logp[:2], {"response_mask": fields["response_mask"][:2]}, _cu(2), totals=totals)
    l1, s1 = sft_loss(logp[2:], {"response_mask": fields["response_mask"][2:]}, _cu(2), totals=totals)
    assert (l0 + l1).item() == pytest.approx(1.5)
    assert (s0["sft_loss"] + s1["sft_loss"]).item() / 3 == pytest.approx(1.5)


def test_sft_gradient_is_zero_on_untrained_tokens():
    logp = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    loss, _ = sft_loss(logp, {"response_mask": torch.tensor([0, 1, 1])}, _cu(3), totals=Totals(2.0))
    loss.backward()
    assert logp.grad.tolist() == [0.0, -0.5, -0.5]


# Two pairs: (chosen 0, rejected 0), (chosen 1, rejected 1); policy and reference token log-probs.
POLICY = [[-0.5, -0.7], [-1.2], [-0.3, -0.4, -0.2], [-2.0, -1.0]]
REF = [[-0.6, -0.9], [-1.0], [-0.5, -0.5, -0.5], [-1.5, -1.5]]


def _logsigmoid(x):
    return -math.log1p(math.exp(-x))


def _trl(beta, loss_type, eps=0.0):
    """TRL's DPOTrainer: sequence log-probs (summed; IPO: averaged), logits, losses, rewards."""
    agg = (lambda r: sum(r) / len(r)) if loss_type == "ipo" else sum
    pi, ref = [agg(r) for r in POLICY], [agg(r) for r in REF]
    out = []
    for c, r in ((0, 1), (2, 3)):
        logits = (pi[c] - pi[r]) - (ref[c] - ref[r])
        if loss_type == "sigmoid":
            loss = -_logsigmoid(beta * logits) * (1 - eps) - _logsigmoid(-beta * logits) * eps
        else:
            loss = (logits - 1 / (2 * beta)) ** 2
        out.append((loss, beta * (pi[c] - ref[c]), beta * (pi[r] - ref[r]), pi[c], pi[r]))
    n = len(out)
    return {"dpo_loss": sum(o[0] for o in out) / n, "rewards/chosen": sum(o[1] for o in out) / n,
            "rewards/rejected": sum(o[2] for o in out) / n, "rewards/margins": sum(o[1] - o[2] for o in out) / n,
            "rewards/accuracies": sum(o[1] > o[2] for o in out) / n, "logps/chosen": sum(o[3] for o in out) / n,
            "logps/rejected": sum(o[4] for o in out) / n}


@pytest.mark.parametrize("beta,loss_type,eps", [(0.1, "sigmoid", 0.0), (0.5, "sigmoid", 0.2), (0.1, "ipo", 0.0)])
def test_dpo_loss_rewards_and_margins_equal_trl_formulas(beta, loss_type, eps):
    expected = _trl(beta, loss_type, eps)
    logp = torch.tensor([x for r in POLICY for x in r], dtype=torch.float64)
    fields = {"response_mask": torch.ones(len(logp), dtype=torch.int8),
              "ref_logprobs": torch.tensor([x for r in REF for x in r], dtype=torch.float64)}
    cu = _cu(*map(len, POLICY))
    totals = Totals(DPO_LOSS.count(fields, cu))
    loss, sums = dpo_loss(logp, fields, cu, totals=totals, beta=beta, loss_type=loss_type, label_smoothing=eps)
    assert totals.denominator == 2.0 and set(sums) == set(DPO_LOSS.stats) == set(expected)
    assert loss.item() == pytest.approx(expected["dpo_loss"], abs=1e-12)
    stats = means(sums, totals)
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, abs=1e-12), key
    # the pairs one micro-batch each: the losses sum to the whole
    halves = [dpo_loss(logp[a:b], {k: v[a:b] for k, v in fields.items()}, cu[i:i + 3] - cu[i], totals=totals, beta=beta,
                       loss_type=loss_type, label_smoothing=eps)[0] for i, (a, b) in ((0, (0, 3)), (2, (3, 8)))]
    assert sum(halves).item() == pytest.approx(expected["dpo_loss"], abs=1e-12)


def test_dpo_of_a_policy_equal_to_its_reference_is_log_2():
    logp = torch.tensor([-1.0, -2.0])
    fields = {"response_mask": torch.ones(2), "ref_logprobs": logp.clone()}
    loss, sums = dpo_loss(logp, fields, _cu(1, 1), totals=Totals(1.0), beta=0.1, loss_type="sigmoid")
    assert loss.item() == pytest.approx(math.log(2)) and sums["rewards/margins"] == 0.0

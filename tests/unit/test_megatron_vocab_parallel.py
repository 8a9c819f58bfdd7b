"""Vocab-parallel log-probs and entropy on one rank: values and gradients vs plain torch."""

from __future__ import annotations

import torch

from flowrl.backends.train.megatron.vocab_parallel import vocab_parallel_logprobs


def _reference(logits_TV, target_T, temperature):
    logsm = torch.log_softmax(logits_TV / temperature, dim=-1)
    return logsm.gather(1, target_T[:, None]).squeeze(1), -(logsm.exp() * logsm).sum(-1)


def test_matches_log_softmax_and_ignores_padding_columns():
    g = torch.Generator().manual_seed(0)
    logits_TV = torch.randn(5, 13, generator=g, dtype=torch.float64)
    padded_TV = torch.cat([logits_TV, torch.full((5, 3), 50.0, dtype=torch.float64)], dim=1)
    target_T = torch.tensor([0, 12, 3, 7, 7])
    logp_T, entropy_T = vocab_parallel_logprobs(padded_TV, target_T, vocab_start=0, num_valid=13,
                                                temperature=0.7)
    want_logp, want_entropy = _reference(logits_TV, target_T, 0.7)
    torch.testing.assert_close(logp_T, want_logp.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy_T, want_entropy.float(), rtol=0, atol=1e-6)


def test_gradients_of_both_outputs():
    g = torch.Generator().manual_seed(1)
    logits_TV = torch.randn(4, 9, generator=g, dtype=torch.float64, requires_grad=True)
    target_T = torch.tensor([1, 8, 0, 4])
    weights = torch.randn(2, 4, generator=g, dtype=torch.float64)

    def objective(fn_out):
        logp_T, entropy_T = fn_out
        return (weights[0] * logp_T.double()).sum() + (weights[1] * entropy_T.double()).sum()

    objective(vocab_parallel_logprobs(logits_TV, target_T, vocab_start=0, num_valid=9,
                                      temperature=1.3)).backward()
    got = logits_TV.grad.clone()
    logits_TV.grad = None
    objective(_reference(logits_TV, target_T, 1.3)).backward()
    # the function computes in float32, so compare at float32 precision
    torch.testing.assert_close(got, logits_TV.grad, rtol=0, atol=1e-6)


def test_empty_vocabulary_slice_contributes_nothing():
    logits_TV = torch.randn(3, 4, requires_grad=True)
    logp_T, entropy_T = vocab_parallel_logprobs(logits_TV, torch.tensor([0, 1, 2]),
                                                vocab_start=100, num_valid=0)
    # alone, a slice with no real tokens has an empty softmax: log(0) = -inf
    assert torch.isinf(logp_T).all()
    (logp_T.masked_fill(torch.isinf(logp_T), 0).sum()).backward()
    assert not logits_TV.grad.any()


def test_large_near_one_hot_logits_keep_their_precision():
    # |z| ~ 20-60 with one dominant logit, float32: the shifted form stays within 1e-5 of the
    # float64 values and never gives a negative entropy.
    g = torch.Generator().manual_seed(2)
    logits_TV = torch.randn(32, 200, generator=g) * 3
    logits_TV[:, 5] += torch.linspace(20.0, 60.0, 32)
    target_T = torch.full((32,), 5)
    logp_T, entropy_T = vocab_parallel_logprobs(logits_TV, target_T, vocab_start=0, num_valid=200)
    want_logp, want_entropy = _reference(logits_TV.double(), target_T, 1.0)
    assert bool((entropy_T >= 0).all())
    torch.testing.assert_close(entropy_T.double(), want_entropy, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logp_T.double(), want_logp, rtol=1e-5, atol=1e-6)

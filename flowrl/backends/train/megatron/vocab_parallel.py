"""Token log-probabilities and entropies over a vocabulary sharded across tensor-parallel ranks.

Each rank holds the logits of its vocabulary slice ``[vocab_start, vocab_start + V_local)``; only
``num_valid`` of those columns are real tokens (the rest is megatron's vocabulary padding and is
left out of the softmax, so results equal those over the unpadded vocabulary). Three all-reduces
of ``[T]``-sized tensors (max, sum of exp, target logit / expected logit) replace gathering the
vocabulary. Forward and backward are written out (like megatron's _VocabParallelCrossEntropy) so
only the softmax and the scaled logits are kept for backward.

The second output is a per-token statistic of the softmax: its entropy (``stat="entropy"``), or
SFT label smoothing's ``uniform_nll`` (``stat="uniform_nll"``): the cross-entropy against the
uniform distribution over the real vocabulary, ``logsumexp(z) - mean_v(z)`` (``mean_v`` over all
ranks' valid columns: the sum of ``z`` shares the second all-reduce, the count one more scalar),
whose gradient is ``softmax(z) - 1/V`` (``flowrl.algos.sft_loss.uniform_nll_from_logits``).

Shapes: T = tokens (flattened batch x sequence), V = this rank's vocabulary slice.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _all_reduce(tensor: torch.Tensor, group, op=dist.ReduceOp.SUM) -> None:
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=op, group=group)


STATS = ("entropy", "uniform_nll")
"""The second per-token output's names (the engines' ``token_stat``)."""


class _VocabParallelLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits_TV, target_T, vocab_start, num_valid, temperature, group, stat="entropy"):
        z_TV = logits_TV[:, :num_valid].float() / temperature
        num_tokens = z_TV.shape[0]
        if num_valid:
            max_T = z_TV.amax(dim=-1)
        else:  # this rank's slice is all padding
            max_T = z_TV.new_full((num_tokens,), float("-inf"))
        _all_reduce(max_T, group, op=dist.ReduceOp.MAX)
        # Shifted by the row max: logp and entropy are differences of small numbers, so rows of
        # large near-one-hot logits keep their precision and the entropy stays >= 0.
        z_TV = z_TV.sub_(max_T[:, None])
        exp_TV = torch.exp(z_TV)
        sum_exp_T = exp_TV.sum(dim=-1)
        _all_reduce(sum_exp_T, group)
        lse_T = torch.log(sum_exp_T)
        p_TV = exp_TV.div_(sum_exp_T[:, None])

        local_T = target_T - vocab_start
        in_slice_T = (local_T >= 0) & (local_T < num_valid)
        local_T = torch.where(in_slice_T, local_T, torch.zeros_like(local_T))
        # Pack the target logit and the expected logit sum_v p_v z_v (uniform_nll: the plain sum
        # sum_v z_v; all shifted) into one all-reduce.
        uniform = stat == "uniform_nll"
        both_2T = torch.stack([
            torch.where(in_slice_T, z_TV.gather(1, local_T[:, None]).squeeze(1) if num_valid
                        else torch.zeros_like(max_T), torch.zeros_like(max_T)),
            z_TV.sum(dim=-1) if uniform else (p_TV * z_TV).sum(dim=-1),
        ])
        _all_reduce(both_2T, group)
        target_z_T, sum_z_T = both_2T
        ctx.stat, ctx.vocab = stat, 0.0
        if uniform:
            vocab = torch.tensor([float(num_valid)], dtype=torch.float64, device=z_TV.device)
            _all_reduce(vocab, group)
            ctx.vocab = float(vocab)
            mean_z_T = sum_z_T / ctx.vocab  # mean_v z_v over the real vocabulary
        else:
            mean_z_T = sum_z_T  # E_p[z]
        ctx.save_for_backward(p_TV, z_TV, mean_z_T, local_T, in_slice_T)
        ctx.logits_shape, ctx.logits_dtype = logits_TV.shape, logits_TV.dtype
        ctx.temperature = temperature
        return target_z_T - lse_T, lse_T - mean_z_T

    @staticmethod
    def backward(ctx, grad_logp_T, grad_entropy_T):
        p_TV, z_TV, mean_z_T, local_T, in_slice_T = ctx.saved_tensors
        # d logp / dz_v = 1[v = target] - p_v ;  d entropy / dz_v = p_v (E[z] - z_v) ;
        # d uniform_nll / dz_v = p_v - 1/V
        if ctx.stat == "uniform_nll":
            grad_z_TV = p_TV * (grad_entropy_T - grad_logp_T)[:, None] - (grad_entropy_T / ctx.vocab)[:, None]
        else:
            grad_z_TV = p_TV * (grad_entropy_T[:, None] * (mean_z_T[:, None] - z_TV)
                                - grad_logp_T[:, None])
        if p_TV.shape[1]:
            grad_z_TV.scatter_add_(1, local_T[:, None],
                                   (grad_logp_T * in_slice_T.to(grad_logp_T.dtype))[:, None])
        grad_TV = torch.zeros(ctx.logits_shape, dtype=ctx.logits_dtype, device=p_TV.device)
        grad_TV[:, : p_TV.shape[1]] = grad_z_TV / ctx.temperature
        return grad_TV, None, None, None, None, None, None


def vocab_parallel_logprobs(logits_TV: torch.Tensor, target_T: torch.Tensor, *, vocab_start: int,
                            num_valid: int, temperature: float = 1.0,
                            group: dist.ProcessGroup | None = None, stat: str = "entropy",
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy) of ``softmax(logits / temperature)``, both float32 ``[T]``; with
    ``stat="uniform_nll"`` the second is ``logsumexp(z) - mean_v(z)`` instead (module docstring).

    ``logits_TV`` is this rank's slice of the (padded) vocabulary; call on every rank of ``group``
    (no communication without an initialised process group or with a group of one).
    Differentiable w.r.t. ``logits_TV``; the loss built on the outputs must be the same on every
    rank of ``group`` (as megatron's own vocab-parallel cross-entropy assumes).
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    if stat not in STATS:
        raise ValueError(f"stat={stat!r} is not one of {', '.join(STATS)}")
    return _VocabParallelLogprobEntropy.apply(
        logits_TV, target_T, vocab_start, num_valid, temperature, group, stat)

"""Token log-probabilities and entropies from logits, without a full float32 copy of the logits.

Both functions work in row chunks of about 64 MiB of float32 and save only the logits (which the
model keeps alive anyway) and one number per row for backward; the backward pass recomputes the
softmax chunk by chunk. Results are float32 (float64 for float64 logits) whatever the logits dtype.

Shape letters: N = positions (any leading dims, flattened), V = vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["entropy_from_logits", "logprobs_from_logits"]

# Float32 elements per chunk: 2**24 = 64 MiB.
_CHUNK_ELEMENTS = 1 << 24


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _row_chunks(num_rows: int, vocab: int) -> list[slice]:
    step = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    return [slice(start, start + step) for start in range(0, num_rows, step)]


class _LogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits_NV: Tensor, labels_N: Tensor) -> Tensor:
        dtype = _compute_dtype(logits_NV.dtype)
        lse_N = torch.empty(logits_NV.shape[0], dtype=dtype, device=logits_NV.device)
        for rows in _row_chunks(*logits_NV.shape):
            lse_N[rows] = torch.logsumexp(logits_NV[rows].to(dtype), dim=-1)
        picked_N = logits_NV.gather(-1, labels_N[:, None]).squeeze(-1).to(dtype)
        ctx.save_for_backward(logits_NV, labels_N, lse_N)
        return picked_N - lse_N

    @staticmethod
    def backward(ctx, grad_N: Tensor) -> tuple[Tensor | None, None]:
        logits_NV, labels_N, lse_N = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        # d logp_label / d z_j = 1[j == label] - softmax(z)_j
        grad_NV = torch.empty_like(logits_NV)
        for rows in _row_chunks(*logits_NV.shape):
            g_N1 = grad_N[rows, None].to(lse_N.dtype)
            p_nV = torch.exp(logits_NV[rows].to(lse_N.dtype) - lse_N[rows, None])
            g_nV = (-p_nV * g_N1).scatter_add_(-1, labels_N[rows, None], g_N1)
            grad_NV[rows] = g_nV.to(logits_NV.dtype)
        return grad_NV, None


class _Entropy(torch.autograd.Function):
    """``H = lse(z') - sum(softmax(z') * z')`` with ``z' = z - max(z)`` per row: the shift makes
    both terms small, so near-one-hot rows of large logits keep their precision (the unshifted
    ``lse(z) - E_p[z]`` cancels two numbers of about ``max(z)``) and ``H >= 0`` holds exactly
    (``lse(z') >= 0`` and ``z' <= 0``)."""

    @staticmethod
    def forward(ctx, logits_NV: Tensor) -> Tensor:
        dtype = _compute_dtype(logits_NV.dtype)
        max_N = torch.empty(logits_NV.shape[0], dtype=dtype, device=logits_NV.device)
        lse_N = torch.empty_like(max_N)  # of the shifted logits
        ent_N = torch.empty_like(max_N)
        for rows in _row_chunks(*logits_NV.shape):
            z_nV = logits_NV[rows].to(dtype)
            max_n = z_nV.amax(dim=-1)
            z_nV = z_nV - max_n[:, None]
            lse_n = torch.logsumexp(z_nV, dim=-1)
            p_nV = torch.exp(z_nV - lse_n[:, None])
            # 0 * -inf is NaN: a token of zero probability adds nothing.
            pz_nV = torch.where(p_nV > 0, p_nV * z_nV, 0)
            max_N[rows], lse_N[rows], ent_N[rows] = max_n, lse_n, lse_n - pz_nV.sum(-1)
        ctx.save_for_backward(logits_NV, max_N, lse_N, ent_N)
        return ent_N

    @staticmethod
    def backward(ctx, grad_N: Tensor) -> Tensor | None:
        logits_NV, max_N, lse_N, ent_N = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None
        # H = lse - E_p[z];  dH/dz_j = -p_j (z_j - E_p[z]), the same for the shifted z'
        grad_NV = torch.empty_like(logits_NV)
        for rows in _row_chunks(*logits_NV.shape):
            z_nV = logits_NV[rows].to(lse_N.dtype) - max_N[rows, None]
            p_nV = torch.exp(z_nV - lse_N[rows, None])
            mean_z_n1 = (lse_N[rows] - ent_N[rows])[:, None]
            g_nV = -p_nV * (z_nV - mean_z_n1) * grad_N[rows, None].to(lse_N.dtype)
            grad_NV[rows] = torch.where(p_nV > 0, g_nV, 0).to(logits_NV.dtype)
        return grad_NV


def logprobs_from_logits(logits_NV: Tensor, labels_N: Tensor) -> Tensor:
    """``log_softmax(logits)[label]`` per position, float32, differentiable w.r.t. the logits.

    ``logits_NV`` may have any leading dims (``[..., V]``); ``labels_N`` has those leading dims and
    the result has the shape of ``labels_N``.
    """
    if logits_NV.shape[:-1] != labels_N.shape:
        raise ValueError(
            f"logits shape {tuple(logits_NV.shape)} and labels shape {tuple(labels_N.shape)} disagree; "
            "labels must have the logits' shape without the last (vocabulary) dim"
        )
    vocab = logits_NV.shape[-1]
    logp_N = _LogProbs.apply(logits_NV.reshape(-1, vocab), labels_N.reshape(-1).long())
    return logp_N.reshape(labels_N.shape)


def entropy_from_logits(logits_NV: Tensor) -> Tensor:
    """Entropy of the softmax per position, ``logsumexp(z) - sum(softmax(z) * z)``, float32.

    Differentiable w.r.t. the logits; any leading dims, the result drops the last one.
    """
    vocab = logits_NV.shape[-1]
    ent_N = _Entropy.apply(logits_NV.reshape(-1, vocab))
    return ent_N.reshape(logits_NV.shape[:-1])

"""Supervised fine-tuning: the negative log-likelihood of the assistant tokens only.

A conversation's tokens are one row (``flowrl.data.chat``): its ``response_mask`` is 1 on the
tokens the assistant wrote (and the end-of-turn tokens after them), 0 on the system, user and
tool tokens and on the template's headers. The loss is the token mean over the mini-batch's
masked tokens (verl's SFT ``loss_agg_mode=token-mean``), normalised by the global count.

With label smoothing ``eps`` (``algorithm.sft.label_smoothing``; TRL's ``label_smoothing_factor``,
torch's ``cross_entropy(label_smoothing=eps)``) the target is ``(1 - eps)`` on the token and
``eps / V`` on every vocabulary entry, so a token's loss is
``(1 - eps) * -logp(token) + eps * mean_v(-logp(v))``, and ``mean_v(-logp(v)) = logsumexp(z) -
mean_v(z)``: a per-token statistic of the logits the engine computes (``token_stat="uniform_nll"``,
:func:`uniform_nll_from_logits`) beside the log-probs.

Shape letters: T flat response tokens, B1 rows + 1 (offsets), N any leading dims, V vocabulary.
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import Tensor

from flowrl.algos.supervised import SupervisedLoss, Totals

__all__ = ["SFT_LOSS", "UNIFORM_NLL", "sft_count", "sft_loss", "sft_token_stat", "uniform_nll_from_logits"]

LOSS = "sft_loss"
"""The stat: mean negative log-likelihood per assistant token (``actor/sft_loss``)."""


UNIFORM_NLL = "uniform_nll"
"""The engines' name of the per-token statistic ``logsumexp(z) - mean_v(z)`` (``token_stat``)."""


def uniform_nll_from_logits(logits_NV: Tensor) -> Tensor:
    """The cross-entropy of ``softmax(z)`` against the uniform distribution over the vocabulary,
    ``mean_v(-log softmax(z)_v) = logsumexp(z) - mean_v(z)``, per position (float32,
    differentiable; its gradient is ``softmax(z) - 1/V``)."""
    z_NV = logits_NV.float()
    return z_NV.logsumexp(dim=-1) - z_NV.mean(dim=-1)


def sft_token_stat(options: Mapping[str, Any]) -> str | None:
    """The per-token statistic :func:`sft_loss` needs with ``options``: label smoothing's."""
    return UNIFORM_NLL if options.get("label_smoothing", 0.0) > 0 else None


def sft_count(fields: Mapping[str, Tensor], response_cu_B1: Tensor) -> float:
    """Assistant tokens of a micro-batch: its share of the denominator."""
    return float(fields["response_mask"].sum())


def sft_loss(logp_T: Tensor, fields: Mapping[str, Tensor], response_cu_B1: Tensor, *, totals: Totals,
             label_smoothing: float = 0.0, uniform_nll_T: Tensor | None = None) -> tuple[Tensor, dict[str, Any]]:
    """``sum(-logp * mask) / denominator`` over this micro-batch (the mini-batch's token mean
    once summed over micro-batches and ranks); with ``label_smoothing`` eps > 0 each token's
    ``-logp`` becomes ``(1 - eps) * -logp + eps * uniform_nll`` (the module docstring). The sum
    ``sft_loss`` is the plain NLL either way (its mean: the held-out loss verl reports)."""
    mask_T = fields["response_mask"].to(logp_T.dtype)
    nll = -(logp_T * mask_T).sum()
    total = nll
    if label_smoothing > 0:
        if uniform_nll_T is None:
            raise ValueError(f"label_smoothing={label_smoothing} needs uniform_nll_T, the engine's token_stat="
                             f"{UNIFORM_NLL!r} (SFT_LOSS.token_stat asks for it)")
        total = (1.0 - label_smoothing) * nll + label_smoothing * (uniform_nll_T.to(logp_T.dtype) * mask_T).sum()
    loss = total / max(totals.denominator, 1.0)
    return loss, {LOSS: nll.detach()}


def held_out_loss(logp_T: Tensor, mask_T: Tensor) -> float:
    """Validation: the mean negative log-likelihood per assistant token of a whole table."""
    mask_T = mask_T.to(logp_T.dtype)
    return float(-(logp_T * mask_T).sum() / mask_T.sum().clamp(min=1))


SFT_LOSS = SupervisedLoss(name="sft", fields=("response_mask",), count=sft_count, fn=sft_loss, stats=(LOSS,),
                          token_stat=sft_token_stat)

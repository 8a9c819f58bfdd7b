"""KL estimators between the policy and a reference, per token (Schulman's k1, k2, k3).

Every estimator has the signature ``fn(logp_T, ref_logp_T) -> kl_T`` and works elementwise, so
it applies to flat ragged tensors or padded ones alike; masking is the caller's (``agg_loss``).
Numbers follow verl's ``kl_penalty``; ``kl``, ``mse`` and ``low_var_kl`` are verl's names for k1,
k2 and k3. A name with a ``+`` suffix (``k1+``, ``abs+``, ``k3+``, ``low_var_kl+``, ...) is verl's
straight-through form: the value of the named estimator, the gradient of k2 (whose expected
gradient is the true KL's, which k1's and k3's are not). The names are registered in
``KL_ESTIMATORS`` (``flowrl/catalog/algos.py``).

Shape letters: T = tokens of all rows together.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

__all__ = ["KLEstimatorFn", "kl_abs", "kl_abs_st", "kl_k1", "kl_k1_st", "kl_k2", "kl_k3", "kl_k3_st", "straight_through"]

KLEstimatorFn = Callable[[Tensor, Tensor], Tensor]


def kl_k1(logp_T: Tensor, ref_logp_T: Tensor) -> Tensor:
    """``logp - ref``: unbiased, high variance, can be negative."""
    return logp_T - ref_logp_T


def kl_abs(logp_T: Tensor, ref_logp_T: Tensor) -> Tensor:
    """``|logp - ref|``."""
    return (logp_T - ref_logp_T).abs()


def kl_k2(logp_T: Tensor, ref_logp_T: Tensor) -> Tensor:
    """``0.5 * (logp - ref)^2``."""
    return 0.5 * (logp_T - ref_logp_T).square()


def kl_k3(logp_T: Tensor, ref_logp_T: Tensor) -> Tensor:
    """``exp(ref - logp) - (ref - logp) - 1``, log-ratio clamped to ±20 and result to ±10."""
    log_ratio_T = torch.clamp(ref_logp_T - logp_T, min=-20.0, max=20.0)
    kl_T = torch.exp(log_ratio_T) - log_ratio_T - 1
    return torch.clamp(kl_T, min=-10.0, max=10.0)


def straight_through(value_T: Tensor, logp_T: Tensor, ref_logp_T: Tensor) -> Tensor:
    """``value_T`` in the forward pass, the gradient of k2 in the backward pass (verl's ``+``)."""
    k2_T = kl_k2(logp_T, ref_logp_T)
    return k2_T - k2_T.detach() + value_T.detach()


def kl_k1_st(logp_T: Tensor, ref_logp_T: Tensor) -> Tensor:
    """``k1+``: k1's value, k2's gradient."""
    return straight_through(kl_k1(logp_T, ref_logp_T), logp_T, ref_logp_T)


def kl_abs_st(logp_T: Tensor, ref_logp_T: Tensor) -> Tensor:
    """``abs+``: abs's value, k2's gradient."""
    return straight_through(kl_abs(logp_T, ref_logp_T), logp_T, ref_logp_T)


def kl_k3_st(logp_T: Tensor, ref_logp_T: Tensor) -> Tensor:
    """``k3+`` / ``low_var_kl+``: k3's value, k2's gradient."""
    return straight_through(kl_k3(logp_T, ref_logp_T), logp_T, ref_logp_T)

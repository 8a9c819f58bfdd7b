"""KL as a reward penalty: the per-token penalty and the fixed / adaptive coefficient controllers.

``kl_penalty_rewards`` subtracts ``coef * KL(policy || reference)`` from every valid token's
reward (verl's ``apply_kl_penalty``); a controller holds ``coef`` and updates it from the KL it
measured. Controllers are plain state the driver keeps across steps (``state()`` /
``from_state`` for checkpoints). Numbers follow verl's ``FixedKLController`` and
``AdaptiveKLController`` (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593).

Shape letters: T = tokens of all rows together, B = rows, B1 = B + 1 offsets.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

import torch
from torch import Tensor

from flowrl.algos.aggregate import segment_sum
from flowrl.catalog.algos import KL_CONTROLLERS, KL_ESTIMATORS

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "kl_penalty_rewards",
    "make_kl_controller",
]


class KLController(Protocol):
    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...

    def state(self) -> dict: ...


@dataclass
class FixedKLController:
    """A constant coefficient."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""

    def state(self) -> dict:
        return asdict(self)


@dataclass
class AdaptiveKLController:
    """Steers the measured KL towards ``target_kl``:
    ``value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon``."""

    value: float
    target_kl: float
    horizon: int

    def __post_init__(self) -> None:
        if self.target_kl <= 0 or self.horizon <= 0:
            raise ValueError(
                f"the adaptive KL controller needs target_kl > 0 and horizon > 0, got {self.target_kl}, {self.horizon}"
            )

    def update(self, current_kl: float, n_steps: int) -> None:
        """``n_steps``: samples the KL was measured over (verl passes the batch size)."""
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state(self) -> dict:
        return asdict(self)


def make_kl_controller(kind: str, *, kl_coef: float, target_kl: float = 0.1, horizon: int = 10000) -> KLController:
    """A controller of registered ``kind`` (``KL_CONTROLLERS``: fixed, adaptive) starting at ``kl_coef``."""
    cls = KL_CONTROLLERS.get(kind)
    if cls is AdaptiveKLController:
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    return cls(kl_coef)


def kl_penalty_rewards(
    token_rewards_T: Tensor,
    logp_T: Tensor,
    ref_logp_T: Tensor,
    response_mask_T: Tensor,
    cu_seqlens_B1: Tensor,
    *,
    coef: float,
    estimator: str = "k1",
) -> tuple[Tensor, float]:
    """``rewards - coef * kl`` on valid tokens (masked tokens keep their reward), and the KL the
    controller sees: the mean over rows of each row's mean KL over its valid tokens (rows without
    a valid token count 0, as verl's ``masked_mean(..., axis=-1)`` then batch mean).

    ``estimator`` is a registered KL estimator (k1 = verl's ``kl``, abs, k2 = mse, k3 = low_var_kl).
    """
    keep_T = response_mask_T.bool()
    kl_T = torch.where(keep_T, KL_ESTIMATORS.get(estimator)(logp_T.float(), ref_logp_T.float()), 0)
    rewards_T = token_rewards_T.float() - coef * kl_T
    tokens_B = segment_sum(keep_T.float(), cu_seqlens_B1)
    row_kl_B = segment_sum(kl_T, cu_seqlens_B1) / tokens_B.clamp(min=1)
    current_kl = float(row_kl_B.mean()) if row_kl_B.numel() else 0.0
    return rewards_T, current_kl

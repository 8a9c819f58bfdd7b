"""The pure algorithm core: advantage estimators, policy losses, KL estimators, loss aggregation.

Pure torch, no I/O. Token-level tensors are flat over the rows of a batch with ``cu_seqlens_B1``
offsets (see ``aggregate.py``). Each extension point is a ``flowrl.registry.Registry`` in
``registries.py`` (torch-free): adding an estimator or a loss means registering one function.

The names below load on first use (PEP 562), so ``import flowrl.algos.registries`` (the config
does) imports no torch; ``from flowrl.algos import grpo_advantages`` imports the torch module.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES: dict[str, str] = {
    "ADVANTAGE_ESTIMATORS": "flowrl.algos.registries",
    "AGG_MODES": "flowrl.algos.registries",
    "KL_CONTROLLERS": "flowrl.algos.registries",
    "KL_ESTIMATORS": "flowrl.algos.registries",
    "POLICY_LOSSES": "flowrl.algos.registries",
    "register_kl_estimator": "flowrl.algos.registries",
    "register_policy_loss": "flowrl.algos.registries",
    "AdvantageInputs": "flowrl.algos.advantages",
    "Estimator": "flowrl.algos.advantages",
    "broadcast_rows": "flowrl.algos.advantages",
    "gae_advantages": "flowrl.algos.advantages",
    "grpo_advantages": "flowrl.algos.advantages",
    "masked_whiten": "flowrl.algos.advantages",
    "register_estimator": "flowrl.algos.advantages",
    "reinforce_plus_plus_advantages": "flowrl.algos.advantages",
    "reinforce_plus_plus_baseline_advantages": "flowrl.algos.advantages",
    "remax_advantages": "flowrl.algos.advantages",
    "resolve_estimator": "flowrl.algos.advantages",
    "rloo_advantages": "flowrl.algos.advantages",
    "row_scores": "flowrl.algos.advantages",
    "agg_denominator": "flowrl.algos.aggregate",
    "agg_loss": "flowrl.algos.aggregate",
    "masked_mean": "flowrl.algos.aggregate",
    "segment_ids": "flowrl.algos.aggregate",
    "segment_sum": "flowrl.algos.aggregate",
    "kl_abs": "flowrl.algos.kl",
    "kl_k1": "flowrl.algos.kl",
    "kl_k2": "flowrl.algos.kl",
    "kl_k3": "flowrl.algos.kl",
    "AdaptiveKLController": "flowrl.algos.kl_control",
    "FixedKLController": "flowrl.algos.kl_control",
    "kl_penalty_rewards": "flowrl.algos.kl_control",
    "make_kl_controller": "flowrl.algos.kl_control",
    "entropy_from_logits": "flowrl.algos.logprobs",
    "logprobs_from_logits": "flowrl.algos.logprobs",
    "gspo_policy_loss": "flowrl.algos.policy_loss",
    "vanilla_policy_loss": "flowrl.algos.policy_loss",
    "explained_variance": "flowrl.algos.value",
    "value_loss": "flowrl.algos.value",
}
"""Exported name -> the module that defines it."""

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'flowrl.algos' has no attribute {name!r}")
    module = importlib.import_module(home)
    globals().update({n: getattr(module, n) for n, h in _HOMES.items() if h == home})
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))

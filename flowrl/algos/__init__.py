"""The pure algorithm core: advantage estimators, policy losses, KL estimators, loss aggregation.

Pure torch, no I/O. Token-level tensors are flat over the rows of a batch with ``cu_seqlens_B1``
offsets (see ``aggregate.py``). Each extension point is a ``flowrl.registry.Registry``: adding an
estimator or a loss means registering one function.
"""

from flowrl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    Estimator,
    broadcast_rows,
    gae_advantages,
    grpo_advantages,
    masked_whiten,
    register_estimator,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    remax_advantages,
    resolve_estimator,
    rloo_advantages,
    row_scores,
)
from flowrl.algos.aggregate import AGG_MODES, agg_denominator, agg_loss, masked_mean, segment_ids, segment_sum
from flowrl.algos.kl import KL_ESTIMATORS, kl_abs, kl_k1, kl_k2, kl_k3
from flowrl.algos.kl_control import (
    KL_CONTROLLERS,
    AdaptiveKLController,
    FixedKLController,
    kl_penalty_rewards,
    make_kl_controller,
)
from flowrl.algos.logprobs import entropy_from_logits, logprobs_from_logits
from flowrl.algos.policy_loss import POLICY_LOSSES, gspo_policy_loss, vanilla_policy_loss
from flowrl.algos.value_loss import explained_variance, value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "Estimator",
    "FixedKLController",
    "agg_denominator",
    "broadcast_rows",
    "agg_loss",
    "entropy_from_logits",
    "explained_variance",
    "gae_advantages",
    "grpo_advantages",
    "gspo_policy_loss",
    "kl_abs",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalty_rewards",
    "logprobs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_whiten",
    "register_estimator",
    "resolve_estimator",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "remax_advantages",
    "rloo_advantages",
    "row_scores",
    "segment_ids",
    "segment_sum",
    "vanilla_policy_loss",
    "value_loss",
]

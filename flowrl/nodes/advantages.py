"""Nodes between scoring and the update: the KL reward penalty, the advantages and returns, and
DAPO's dynamic-sampling filter. Pure torch in the task; the math lives in ``flowrl.algos``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from flowrl.data import experience
from flowrl.metrics import names
from flowrl.nodes.core import NodeOut, join_columns


def advantages(table: pa.Table, *columns: pa.Table, estimator: str, gamma: float, lam: float, norm_adv_by_std: bool) -> pa.Table:
    """Join the log-prob (and value) columns, then compute advantages and returns (pure torch, in
    the task). Reads ``values`` and ``reward_baseline`` when the table has them."""
    import torch

    from flowrl.algos import AdvantageInputs, resolve_estimator

    table = join_columns(table, *columns)
    rewards_T, cu = experience.token_column(table, "token_rewards")
    mask_T, _ = experience.token_column(table, "response_mask")
    group_B = torch.from_numpy(table.column("group").to_numpy().astype(np.int64))
    # Optional inputs of some estimators: critic values (gae), a reward baseline per row (remax).
    values_T = experience.token_column(table, "values")[0] if "values" in table.column_names else None
    baseline_B = None
    if "reward_baseline" in table.column_names:
        baseline_B = torch.from_numpy(table.column("reward_baseline").to_numpy().astype(np.float32))
    # optimal_token_baseline: the pre-update log-probs and sum_pi_squared (when the batch has them)
    old_T = experience.token_column(table, "old_logprobs")[0] if "sum_pi_squared" in table.column_names else None
    pi2_T = experience.token_column(table, "sum_pi_squared")[0] if old_T is not None else None
    inputs = AdvantageInputs(
        token_rewards_T=rewards_T, response_mask_T=mask_T, cu_seqlens_B1=cu, group_B=group_B,
        values_T=values_T, reward_baseline_B=baseline_B, old_logprobs_T=old_T, sum_pi_squared_T=pi2_T,
    )
    adv_T, ret_T = resolve_estimator(estimator)(inputs, gamma=gamma, lam=lam, norm_adv_by_std=norm_adv_by_std)
    return experience.with_columns(
        table,
        advantages=experience.list_column(adv_T, cu, experience.TOKEN_FLOATS),
        returns=experience.list_column(ret_T, cu, experience.TOKEN_FLOATS),
    )


def kl_in_reward(table: pa.Table, *columns: pa.Table, coef: float, estimator: str) -> NodeOut:
    """Join the log-prob columns, then ``token_rewards -= coef * KL(old || ref)`` on valid tokens
    (``score`` keeps the task's score). Metrics as verl: ``actor/reward_kl_penalty`` (the mean
    per-row KL the controller sees) and ``actor/reward_kl_penalty_coeff``."""
    from flowrl.algos import kl_penalty_rewards

    table = join_columns(table, *columns)
    rewards_T, cu = experience.token_column(table, "token_rewards")
    mask_T, _ = experience.token_column(table, "response_mask")
    logp_T, _ = experience.token_column(table, "old_logprobs")
    ref_T, _ = experience.token_column(table, "ref_logprobs")
    penalised_T, current_kl = kl_penalty_rewards(rewards_T, logp_T, ref_T, mask_T, cu, coef=coef, estimator=estimator)
    out = experience.with_columns(table, token_rewards=experience.list_column(penalised_T, cu, experience.TOKEN_FLOATS))
    return NodeOut(out, {names.REWARD_KL_PENALTY: current_kl, names.REWARD_KL_PENALTY_COEFF: float(coef)})


def filter_metric(table: pa.Table, metric: str) -> Any:
    """The per-row value dynamic sampling compares within a group (``FILTER_METRICS``)."""
    import torch

    if metric == "score":
        return torch.from_numpy(table.column("score").to_numpy().astype(np.float64))
    rewards_T, cu = experience.token_column(table, "token_rewards")
    from flowrl.algos import segment_sum

    if metric == "seq_reward":
        return segment_sum(rewards_T.double(), cu)
    # seq_final_reward: the reward at each row's last token (0 for an empty row)
    nonempty_B = cu.diff() > 0
    last_B = torch.zeros(nonempty_B.numel(), dtype=torch.float64)
    last_B[nonempty_B] = rewards_T.double()[cu[1:][nonempty_B] - 1]
    return last_B


def filter_groups(table: pa.Table, metric: str) -> NodeOut:
    """Keep the rows of groups whose ``metric`` varies (DAPO's dynamic sampling filter)."""
    import torch

    from flowrl.algos.dapo import keep_informative_groups

    group_B = torch.from_numpy(table.column("group").to_numpy().astype(np.int64))
    keep_B = keep_informative_groups(filter_metric(table, metric), group_B)
    kept = table.filter(pa.array(keep_B.numpy()))
    num_groups = len(set(table.column("group").to_pylist()))
    kept_groups = len(set(kept.column("group").to_pylist()))
    return NodeOut(kept, {names.KEPT_GROUPS: float(kept_groups), names.GROUPS: float(num_groups)})


def rollout_correction(table: pa.Table, *, threshold: float, threshold_lower: float | None, level: str, mode: str,
                       veto_threshold: float | None, apply: bool) -> NodeOut:
    """The rollout correction (``flowrl.algos.rollout_correction``) from ``old_logprobs`` and
    ``rollout_logprobs``: the ``rollout_corr/*`` metrics, and with ``apply`` the batch the actor
    trains on, its advantages times the importance weights (column ``rollout_is_weights`` too)
    and, in the mask mode or with a veto, the rejected tokens out of its ``response_mask``."""
    from flowrl.algos.rollout_correction import RolloutCorrection, apply_to_advantages, rollout_importance_weights

    for name in ("old_logprobs", "rollout_logprobs"):
        if name not in table.column_names:
            raise ValueError(f"algorithm.rollout_is_threshold needs the column {name!r}; the batch has {table.column_names}")
    old_T, cu = experience.token_column(table, "old_logprobs")
    rollout_T, _ = experience.token_column(table, "rollout_logprobs")
    mask_T, _ = experience.token_column(table, "response_mask")
    spec = RolloutCorrection(threshold=threshold, threshold_lower=threshold_lower, level=level, mode=mode,
                             veto_threshold=veto_threshold)
    weights_T, new_mask_T, metrics = rollout_importance_weights(old_T, rollout_T, mask_T, cu, spec)
    if not apply:
        return NodeOut(table, metrics)
    adv_T, _ = experience.token_column(table, "advantages")
    table = experience.with_columns(
        table,
        advantages=experience.list_column(apply_to_advantages(adv_T, weights_T), cu, experience.TOKEN_FLOATS),
        rollout_is_weights=experience.list_column(weights_T, cu, experience.TOKEN_FLOATS),
        response_mask=experience.list_column(new_mask_T, cu, table.schema.field("response_mask").type),
    )
    return NodeOut(table, metrics)

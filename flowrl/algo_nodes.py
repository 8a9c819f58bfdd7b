"""Graph node bodies of the algorithm family beyond GRPO: critic values and update, the KL reward
penalty, ReMax's greedy baseline, and PPO's value metrics. ``graphs/ppo.py`` wires them.

Like ``flowrl.nodes``: each body takes worker-group calls (``BoundCall``) and tables, returns a
table or a :class:`~flowrl.nodes.NodeOut`; the math lives in ``flowrl.algos``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.actors.group import BoundCall
from flowrl.data import experience
from flowrl.nodes import NodeOut, collect, reward


def values(critic: BoundCall, table: pa.Table) -> NodeOut:
    """A one-column table of ``values``: the critic's value of every response token."""
    result, compute_s = critic.run("compute_values", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT)
    return NodeOut(result, {"compute_s/values": compute_s})


def update_critic(critic: BoundCall, table: pa.Table, mini_batch_rows: int) -> NodeOut:
    metrics, compute_s = critic.run(
        "update", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.OUTPUT, kwargs={"mini_batch_rows": mini_batch_rows}
    )
    return NodeOut(metrics, {**metrics, "compute_s/update_critic": compute_s})


def kl_in_reward(table: pa.Table, *columns: pa.Table, coef: float, estimator: str) -> NodeOut:
    """Join the log-prob columns, then ``token_rewards -= coef * KL(old || ref)`` on valid tokens
    (``score`` keeps the task's score). Metrics as verl: ``actor/reward_kl_penalty`` (the mean
    per-row KL the controller sees) and ``actor/reward_kl_penalty_coeff``."""
    from flowrl.algos import kl_penalty_rewards

    for extra in columns:
        table = experience.with_columns(table, **{name: extra.column(name) for name in extra.column_names})
    rewards_T, cu = experience.token_column(table, "token_rewards")
    mask_T, _ = experience.token_column(table, "response_mask")
    logp_T, _ = experience.token_column(table, "old_logprobs")
    ref_T, _ = experience.token_column(table, "ref_logprobs")
    penalised_T, current_kl = kl_penalty_rewards(rewards_T, logp_T, ref_T, mask_T, cu, coef=coef, estimator=estimator)
    out = experience.with_columns(table, token_rewards=experience.list_column(penalised_T, cu, experience.TOKEN_FLOATS))
    return NodeOut(out, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(coef)})


def generate_greedy(rollout: BoundCall, prompts: pa.Table, sampling: Any) -> NodeOut:
    """One greedy response per prompt (``sampling``: n=1, temperature 0)."""
    table, compute_s = rollout.run(
        "generate", prompts, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT, kwargs={"sampling": sampling}
    )
    return NodeOut(table, {"compute_s/gen_baseline": compute_s})


def reward_baseline(samples: pa.Table, greedy: pa.Table, tokenizer_dir: str, reward_fn: str) -> NodeOut:
    """Score the greedy responses and put each prompt's greedy score on its samples as
    ``reward_baseline`` (ReMax). Metric ``reward_baseline/mean``."""
    scored = reward(greedy, tokenizer_dir, reward_fn).value
    by_group = dict(zip(scored.column("group").to_pylist(), scored.column("score").to_pylist()))
    groups = samples.column("group").to_pylist()
    missing = sorted(set(groups) - set(by_group))
    if missing:
        raise RuntimeError(f"greedy baseline is missing prompt group(s) {missing[:5]}; every prompt needs one")
    baseline = np.array([by_group[g] for g in groups], dtype=np.float32)
    out = experience.with_columns(samples, reward_baseline=pa.array(baseline, pa.float32()))
    return NodeOut(out, {"reward_baseline/mean": float(scored.column("score").to_numpy().mean())})


def collect_ppo(table: pa.Table, *after: Any) -> NodeOut:
    """``nodes.collect`` plus the critic's data metrics (verl's names): values, returns and the
    explained variance of the returns by the values the advantages used."""
    from flowrl.algos import explained_variance

    out = collect(table, *after)
    if "values" in table.column_names:
        values_T, _ = experience.token_column(table, "values")
        returns_T, _ = experience.token_column(table, "returns")
        mask_T, _ = experience.token_column(table, "response_mask")
        keep_T = mask_T.bool()
        if bool(keep_T.any()):
            v, r = values_T[keep_T], returns_T[keep_T]
            out.metrics.update({
                "critic/values/mean": float(v.mean()), "critic/values/max": float(v.max()), "critic/values/min": float(v.min()),
                "critic/returns/mean": float(r.mean()), "critic/returns/max": float(r.max()), "critic/returns/min": float(r.min()),
                "critic/vf_explained_var": explained_variance(values_T, returns_T, mask_T),
            })
    return out


def overlong(table: pa.Table, *, max_response_length: int, buffer_len: int, penalty_factor: float) -> NodeOut:
    """DAPO's overlong shaping: add the length penalty to each row's last token reward (``score``
    keeps the task's score). Metrics ``reward/overlong_penalty/mean``, ``reward/overlong_frac``."""
    import torch

    from flowrl.algos.dapo import overlong_penalty

    rewards_T, cu = experience.token_column(table, "token_rewards")
    lengths_B = cu.diff()
    penalty_B = overlong_penalty(lengths_B, max_response_length=max_response_length, buffer_len=buffer_len,
                                 penalty_factor=penalty_factor)
    shaped_T = rewards_T.float().clone()
    last_T = (cu[1:] - 1)[lengths_B > 0]
    shaped_T[last_T] += penalty_B[lengths_B > 0]
    out = experience.with_columns(table, token_rewards=experience.list_column(shaped_T, cu, experience.TOKEN_FLOATS))
    return NodeOut(out, {
        "reward/overlong_penalty/mean": float(penalty_B.mean()) if penalty_B.numel() else 0.0,
        "reward/overlong_frac": float((penalty_B < 0).to(torch.float32).mean()) if penalty_B.numel() else 0.0,
    })


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
    return NodeOut(kept, {"dynamic_sampling/kept_groups": float(kept_groups), "dynamic_sampling/groups": float(num_groups)})


def rm_scores(rm: BoundCall, table: pa.Table) -> NodeOut:
    """A one-column table of ``rm_score``: the reward model's score of every response."""
    result, compute_s = rm.run("compute_rm_scores", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT)
    return NodeOut(result, {"compute_s/rm_score": compute_s})


def combine_rewards(table: pa.Table, rm: pa.Table, *, rule_coef: float, rm_coef: float) -> NodeOut:
    """``score = rule_coef * (reward function's score) + rm_coef * (reward model's score)``, on
    the last token's reward too; keeps ``rule_score`` and ``rm_score`` as columns. Metrics
    ``reward/rule_score/mean`` and ``reward/rm_score/mean``."""
    rule_B = table.column("score").to_numpy().astype(np.float32)
    rm_B = rm.column("rm_score").to_numpy().astype(np.float32)
    if rm_B.shape != rule_B.shape:
        raise RuntimeError(f"reward model scored {rm_B.shape[0]} rows, the batch has {rule_B.shape[0]}")
    score_B = rule_coef * rule_B + rm_coef * rm_B
    lengths = [len(r) for r in table.column("response_ids").to_pylist()]
    token_rewards = [[0.0] * (n - 1) + [float(s)] if n else [] for n, s in zip(lengths, score_B)]
    out = experience.with_columns(
        table,
        rule_score=pa.array(rule_B, pa.float32()),
        rm_score=pa.array(rm_B, pa.float32()),
        score=pa.array(score_B, pa.float32()),
        token_rewards=experience.from_lists(token_rewards, experience.TOKEN_FLOATS),
    )
    return NodeOut(out, {"reward/rule_score/mean": float(rule_B.mean()), "reward/rm_score/mean": float(rm_B.mean())})

"""The checks of one step's experience and metrics (issue 32 items 2, 3 and 6).

- ``staleness``: every trained row's weight-version lag (the step's index minus its
  ``weight_version``) against the run's bound (``trainer.staleness``, and in stream mode the
  queue's ``trainer.max_queue_size``); a row older, or from a version not trained yet, fails.
- ``finite``: NaN or inf in the rewards (``score``, ``token_rewards``), the ``advantages``,
  ``returns`` or critic ``values``: fails at once.
- ``reward_signal``: no learning signal for ``reward_signal_steps`` steps in a row: every
  reward of the batch equal (all zero, or any constant), or every advantage exactly 0 (every
  group's rewards equal: group-relative estimators learn nothing).
- ``reward_time``: the reward function took longer than the generation it scores
  (``timing_s/reward`` > ``timing_s/gen``) three steps in a row.
- ``logprob_agreement``: the rollout engine's log-probs of its own tokens against the
  trainer's (``rollout_logprobs`` vs ``old_logprobs``, where a step computes both): the mean
  per-token KL (k3, as ``rollout_corr/k3_kl``) over the response tokens of the rows generated
  with the trainer's current weights (``weight_version`` equal to the step's index: an older
  version's drift is real, the rollout correction's business) above ``logprob_kl_max``.
"""

from __future__ import annotations

import numpy as np

from flowrl.catalog import metric_names as names
from flowrl.checks.base import Limits, StepData, Verdict, first_row, flat, register_check, skipped

SCORE_CAUSES = "the reward function or the reward model returned NaN/inf"
FINITE_COLUMNS = (
    ("score", SCORE_CAUSES),
    ("token_rewards", SCORE_CAUSES + ", or the KL-in-reward penalty overflowed"),
    ("advantages", "a NaN reward, a NaN critic value, or the estimator's normalisation (a zero std without epsilon)"),
    ("returns", "a NaN reward or a NaN critic value"),
    ("values", "the critic diverged (a too-large critic learning rate or no value clipping)"),
)


@register_check("staleness", default="error")
def staleness(data: StepData, limits: Limits, memory: dict) -> Verdict:
    table = data.table
    if "weight_version" not in table.column_names:
        return Verdict(True, 0.0, "generated in the step's own graph with the latest weights (lag 0)")
    if not table.num_rows:
        return skipped("no rows trained")
    versions = table.column("weight_version").to_numpy()
    lag = data.index - versions
    worst = int(lag.max())
    bound = f"the bound {limits.max_lag} ({limits.lag_source})"
    if lag.min() < 0:
        rows = np.flatnonzero(lag < 0)
        return Verdict(False, float(worst), (
            f"{len(rows)} of {len(lag)} trained rows claim weight version {int(versions[rows[0]])} at step "
            f"{data.index + 1}, whose trainer has made only versions 0..{data.index} ({first_row(table, rows)}); "
            "likely cause: the weight-version bookkeeping of the rollout source is wrong"))
    if worst > limits.max_lag:
        rows = np.flatnonzero(lag > limits.max_lag)
        return Verdict(False, float(worst), (
            f"{len(rows)} of {len(lag)} trained rows were generated {worst} weight versions behind the trainer "
            f"(step {data.index + 1} trains on version {data.index}; {first_row(table, rows)} has weight_version "
            f"{int(versions[rows[0]])}), past {bound}; likely cause: a generation-ahead pipeline or rollout queue "
            "that does not refuse old requests, or weight syncs that did not reach the rollout"))
    return Verdict(True, float(worst), f"max lag {worst} <= {limits.max_lag}")


@register_check("finite", default="error")
def finite(data: StepData, limits: Limits, memory: dict) -> Verdict:
    table = data.table
    present = [(c, why) for c, why in FINITE_COLUMNS if c in table.column_names]
    if not present:
        return skipped("no rewards or advantages in this step's table")
    bad_total, first = 0, None
    for column, why in present:
        if pa_is_list(table, column):
            values, offsets = flat(table, column)
            bad = np.flatnonzero(~np.isfinite(values))
            rows = np.searchsorted(offsets, bad, side="right") - 1
        else:
            values = table.column(column).to_numpy(zero_copy_only=False)
            rows = bad = np.flatnonzero(~np.isfinite(values))
        bad_total += len(bad)
        if len(bad) and first is None:
            nan = int(np.isnan(values[bad]).sum())
            first = (f"{column} has {nan} NaN and {len(bad) - nan} inf values in {len(np.unique(rows))} rows "
                     f"(first: {first_row(table, rows)}); likely cause: {why}")
    if first is not None:
        return Verdict(False, float(bad_total), first)
    return Verdict(True, 0.0, "rewards and advantages finite")


def pa_is_list(table: object, column: str) -> bool:
    import pyarrow as pa

    return pa.types.is_list(table.schema.field(column).type)  # type: ignore[attr-defined]


def _no_signal(table: object) -> str | None:
    """Why the step has no learning signal, or None when it has one."""
    score = table.column("score").to_numpy(zero_copy_only=False)  # type: ignore[attr-defined]
    if score.min() == score.max():
        return "every reward is 0" if score.max() == 0 else f"every reward is {float(score.max()):g}"
    if "advantages" in table.column_names:  # type: ignore[attr-defined]
        adv, _ = flat(table, "advantages")
        if adv.size and not np.any(adv):
            groups = len(np.unique(table.column("group").to_numpy())) if "group" in table.column_names else 0  # type: ignore[attr-defined]
            return f"every advantage is 0: the rewards are equal within each of the {groups} groups"
    return None


@register_check("reward_signal", default="warn")
def reward_signal(data: StepData, limits: Limits, memory: dict) -> Verdict:
    table = data.table
    if not {"score", "token_rewards"} <= set(table.column_names) or not table.num_rows:
        return skipped("no rewards in this step's table (a supervised family's batch)")
    why = _no_signal(table)
    streak = memory["streak"] = memory.get("streak", 0) + 1 if why else 0
    if why is None:
        return Verdict(True, 0.0, "rewards vary")
    text = f"{why} for {streak} step{'s' * (streak > 1)} in a row (step {data.index + 2 - streak}..{data.index + 1})"
    if streak < limits.no_signal_steps:
        return Verdict(True, float(streak), text + f", of {limits.no_signal_steps} allowed")
    return Verdict(False, float(streak), (
        f"no learning signal: {text}; likely cause: a reward function that cannot score this data "
        "(wrong data_source, answer format or ground_truth column), a task too hard or too easy for the "
        "model, or a reward model that outputs a constant (trainer.checks.reward_signal_steps="
        f"{limits.no_signal_steps})"))


SLOW_REWARD_STEPS = 3
"""``reward_time`` fails when scoring is slower than generation this many steps in a row (one slow
step is a loaded machine's noise, not a slow reward function)."""


@register_check("reward_time", default="warn")
def reward_time(data: StepData, limits: Limits, memory: dict) -> Verdict:
    gen, reward = data.metrics.get(names.timing("gen")), data.metrics.get(names.timing("reward"))
    if gen is None or reward is None or gen <= 0:
        return skipped("no timing_s/gen and timing_s/reward in this step")
    ratio = reward / gen
    streak = memory["streak"] = memory.get("streak", 0) + 1 if ratio > 1.0 else 0
    # no number logged: the ratio of two wall times would differ between a run and its resume (the times
    # themselves are timing_s/gen and timing_s/reward)
    if streak < SLOW_REWARD_STEPS:
        return Verdict(True, float("nan"), f"reward {reward:.3f}s, gen {gen:.3f}s ({streak} slower step(s) in a row)")
    return Verdict(False, float("nan"), (
        f"scoring took {reward:.3f}s, longer than the generation it scores ({gen:.3f}s, x{ratio:.1f}), "
        f"{streak} steps in a row; likely cause: a slow reward function (per-row model calls, a sandbox, a "
        "remote service): make it faster or batch it, or serve it as a reward model (reward_model.enable)"))


@register_check("logprob_agreement", default="warn")
def logprob_agreement(data: StepData, limits: Limits, memory: dict) -> Verdict:
    table = data.table
    if not {"rollout_logprobs", "old_logprobs", "response_mask"} <= set(table.column_names):
        return skipped("no trainer log-probs of the rollout's tokens in this step (old_logprobs)")
    rollout, _ = flat(table, "rollout_logprobs")
    old, _ = flat(table, "old_logprobs")
    mask, offsets = flat(table, "response_mask")
    keep = mask.astype(bool)
    if "weight_version" in table.column_names:  # rows generated with older weights drift for real: left out
        same = table.column("weight_version").to_numpy() == data.index
        keep &= np.repeat(same, np.diff(offsets))
    if not keep.any():
        return skipped("no response tokens generated with the trainer's current weights")
    r = np.clip(old[keep].astype(np.float64) - rollout[keep], -20.0, 20.0)
    k3 = float(np.mean(np.expm1(r) - r))
    if k3 <= limits.logprob_kl_max:
        return Verdict(True, k3, f"rollout/trainer KL {k3:.2g} <= {limits.logprob_kl_max:g}")
    return Verdict(False, k3, (
        f"the rollout engine's log-probs of its own tokens disagree with the trainer's: mean per-token KL "
        f"{k3:.3g} > {limits.logprob_kl_max:g} (largest |difference| {float(np.max(np.abs(r))):.3g}); likely "
        "causes: stale or partial weights in the engine (a weight sync that did not land, a LoRA adapter not "
        "applied), a dtype mismatch (a bf16 engine against an fp32 trainer), sampling settings the log-probs "
        "ignore (temperature, top-k/top-p), or MoE routing"))

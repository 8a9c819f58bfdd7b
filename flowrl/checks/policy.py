"""The policy really moved (issue 32 item 2), from what a step already has.

After updates, the rollout engine's log-probs of its own tokens (``rollout_logprobs``) must have
left the reference model's (``ref_logprobs``) about as far as the trainer has
(``actor/kl_loss``: the trainer's KL to the reference on the same batch). An engine that keeps
sampling the base model (a weight sync that never lands, LoRA adapters the engine does not
apply) shows ``KL(rollout, ref)`` near 0 while the trainer's is not. Judged from the second
step on, on rows generated with the trainer's current weights, once the trainer's KL is at least
``MIN_KL`` (before that the policy has not moved enough to tell).
"""

from __future__ import annotations

import numpy as np

from flowrl.catalog import metric_names as names
from flowrl.checks.base import Limits, StepData, Verdict, flat, register_check, skipped

MIN_KL = 1e-3
"""The trainer's KL to the reference (``actor/kl_loss``) below which nothing is judged."""
RATIO = 0.1
"""The rollout's KL to the reference must be at least this fraction of the trainer's."""


def _kl_to_ref(data: StepData) -> float | None:
    """The mean k3 KL between the rollout's and the reference's log-probs over the response
    tokens of the rows generated with the trainer's current weights (None: no such token)."""
    table = data.table
    rollout, _ = flat(table, "rollout_logprobs")
    ref, _ = flat(table, "ref_logprobs")
    mask, offsets = flat(table, "response_mask")
    keep = mask.astype(bool)
    if "weight_version" in table.column_names:
        keep &= np.repeat(table.column("weight_version").to_numpy() == data.index, np.diff(offsets))
    if not keep.any():
        return None
    r = np.clip(ref[keep].astype(np.float64) - rollout[keep], -20.0, 20.0)
    return float(np.mean(np.expm1(r) - r))


@register_check("policy_moved", default="warn")
def policy_moved(data: StepData, limits: Limits, memory: dict) -> Verdict:
    trainer_kl = data.metrics.get(names.ACTOR_KL_LOSS)
    if data.index == 0 or trainer_kl is None:
        return skipped("no update before this step, or no actor/kl_loss (actor.use_kl_loss=false)")
    if not {"rollout_logprobs", "ref_logprobs", "response_mask"} <= set(data.table.column_names):
        return skipped("no rollout and reference log-probs in this step")
    if trainer_kl < MIN_KL:
        return skipped(f"the trainer's KL to the reference ({trainer_kl:.2g}) is too small to tell")
    rollout_kl = _kl_to_ref(data)
    if rollout_kl is None:
        return skipped("no rows generated with the trainer's current weights")
    ratio = rollout_kl / trainer_kl
    if ratio >= RATIO:
        return Verdict(True, ratio, f"rollout KL to the reference {rollout_kl:.3g}, trainer's {trainer_kl:.3g}")
    return Verdict(False, ratio, (
        f"after {data.index} updates the rollout engine still samples like the reference model: its KL to the "
        f"reference is {rollout_kl:.3g}, the trainer's {trainer_kl:.3g} (x{ratio:.2g}, under {RATIO:g}); likely "
        "cause: the weight sync does not reach the engine (the engine samples the base model or an old version; "
        "with LoRA, adapters the engine does not apply)"))

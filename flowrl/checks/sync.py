"""Weight-sync verification (issue 32 item 1), as the step sees it.

The sync node compares the trainer's and the generation engine's fingerprints of every parameter
after each sync (:mod:`flowrl.checks.fingerprint`, :func:`flowrl.nodes.weights.verify_fingerprints`)
and reports ``reshard/fingerprint_params`` and ``reshard/fingerprint_mismatch``; the sync's
metrics join the step that collects it (the next one). In ``error`` mode the node itself fails
the sync with the parameter and ranks named; this check puts the result on the health line and
in ``checks/weight_sync`` (and warns in ``warn`` mode). A step whose sync moved nothing (a
hybrid engine that generates with the training parameters) has nothing to check.
"""

from __future__ import annotations

from typing import Any

from flowrl.checks.base import Limits, StepData, Verdict, register_check, skipped

PARAMS = "reshard/fingerprint_params"
MISMATCH = "reshard/fingerprint_mismatch"
PROBE = "reshard/probe_logp"
"""The generation engine's summed log-probs of :data:`PROBE_RESPONSE` after :data:`PROBE_PROMPT`, right after the sync."""
TRAINER = "reshard/fingerprint_src"
"""The trainer's weights after the update, one number (the sum of its fingerprints, as compared)."""
PROBE_PROMPT = list(range(3, 11))
PROBE_RESPONSE = list(range(11, 19))
"""A fixed probe batch: token ids every vocabulary has (the ids only matter for being fixed)."""


def probe_logp(engine: Any) -> float:
    """An engine's summed log-probs of the probe response (teacher-forced, temperature 1): one
    short forward, on each engine rank after it took the sync (every rank of an engine whose
    forward is collective, as vLLM's in the trainer's processes)."""
    (row,) = engine.logprobs([PROBE_PROMPT], [PROBE_RESPONSE], temperature=1.0)
    return float(sum(row))


@register_check("weight_sync", default="error")
def weight_sync(data: StepData, limits: Limits, memory: dict) -> Verdict:
    if PARAMS not in data.metrics:
        return skipped("no weight sync collected in this step (or one that moved nothing)")
    bad, compared = int(data.metrics.get(MISMATCH, 0)), int(data.metrics[PARAMS])
    if bad:
        return Verdict(False, float(bad), f"{bad} of {compared} parameters differ between the trainer and the "
                       "generation engine after the weight sync (the sync's log names them): a partial or "
                       "corrupted transfer, or an engine that did not apply the update")
    return Verdict(True, 0.0, f"{compared} parameters equal on both sides")


@register_check("engine_moved", default="warn")
def engine_moved(data: StepData, limits: Limits, memory: dict) -> Verdict:
    """Issue 32 item 2: when the trainer's weights changed between two syncs, the generation
    engine's log-probs of a fixed probe batch must change too (an engine sampling an old copy or
    the base model keeps them). Runs with the weight-sync check (its fingerprints and the probe
    come from the same sync); a step with no sync has nothing to judge."""
    if PROBE not in data.metrics or TRAINER not in data.metrics:
        return skipped("no probe in this step (no weight sync collected, one that moved nothing, or "
                       "trainer.checks.weight_sync=off)")
    now = [float(data.metrics[PROBE]), float(data.metrics[TRAINER])]
    before, memory["last"] = memory.get("last"), now
    if before is None:
        return skipped("the first sync: the probe has nothing to compare with yet")
    if now[1] == before[1]:
        return Verdict(True, 0.0, "the trainer's weights did not change since the last sync")
    if now[0] != before[0]:
        return Verdict(True, abs(now[0] - before[0]), f"probe log-prob {before[0]:.6g} -> {now[0]:.6g}")
    return Verdict(False, 0.0, (
        f"the trainer's weights changed since the last sync but the generation engine's log-probs of the fixed "
        f"probe batch did not ({now[0]:.6g} both times); likely cause: the engine generates with an old copy of "
        "the weights (an update written somewhere it does not read, a cache not invalidated, a LoRA adapter "
        "installed but not applied)"))

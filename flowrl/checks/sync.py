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

from flowrl.checks.base import Limits, StepData, Verdict, register_check, skipped

PARAMS = "reshard/fingerprint_params"
MISMATCH = "reshard/fingerprint_mismatch"


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

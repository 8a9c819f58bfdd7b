"""Metric names, defined once (verl's names where verl has one).

Every name a library module writes or reads is a constant here, or built by one of the functions
below for families of names (``timing_s/<node>``); modules import these instead of spelling the
strings. The dashboard groups names by their prefix (``actor/``, ``critic/``, ``timing_s/`` ...).
"""

from __future__ import annotations

# --------------------------------------------------------------------------- the step
STEP_TIME = "timing_s/step"
THROUGHPUT = "perf/throughput"
TIME_PER_STEP = "perf/time_per_step"
GLOBAL_STEP = "training/global_step"
VALIDATION_TIME = "timing_s/validation"

# --------------------------------------------------------------------------- data (verl's names)
SCORE_MEAN = "critic/score/mean"
SCORE_MAX = "critic/score/max"
SCORE_MIN = "critic/score/min"
NUM_SAMPLES = "num_samples"
NUM_RESPONSE_TOKENS = "num_response_tokens"
NUM_TOKENS = "num_tokens"

# --------------------------------------------------------------------------- prefixes
RESHARD_PREFIX = "reshard/"
VALIDATION_PREFIX = "val-"


def timing(node: str) -> str:
    """Wall time of graph node ``node`` inside its task: ``timing_s/<node>``."""
    return f"timing_s/{node}"


def compute(what: str) -> str:
    """The slowest rank's time inside the actor method behind ``what``: ``compute_s/<what>``."""
    return f"compute_s/{what}"

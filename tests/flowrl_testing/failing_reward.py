"""A reward function that raises once a file it is told of is non-empty: a real error inside a
graph node at a known moment, for the exit-time tests.

``algorithm.reward_fn=flowrl_testing.failing_reward:compute_score`` scores as ``auto`` does until
``FLOWRL_TEST_FAIL_AFTER`` (a path, e.g. the run's ``metrics.jsonl``) has content; then it writes
the time of its first failure to ``<that path>.raised`` and raises.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from flowrl.rewards.math import auto


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    marker = os.environ.get("FLOWRL_TEST_FAIL_AFTER")
    if marker and Path(marker).is_file() and Path(marker).stat().st_size > 0:
        raised = Path(marker + ".raised")
        if not raised.exists():
            raised.write_text(repr(time.time()))
        raise ValueError("flowrl test: this reward function fails on purpose")
    return auto(data_source, solution_str, ground_truth, extra_info)

"""A reward function that holds one step at a known point, so crash tests kill at a known moment.

``algorithm.reward_fn=gated_reward:compute_score`` scores as ``auto`` does. With
``FLOWRL_TEST_GATE=<dir>`` set, the first call made once ``<dir>/arm_when`` names an existing path
(e.g. a run's ``checkpoints/latest``) touches ``<dir>/blocked`` and waits (at most 120 s) for
``<dir>/release``: the step is then in flight, its reward node running on the controller worker.
It fires once (``<dir>/fired``), so the step's rerun after a recovery is not held.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from flowrl.rewards.math import auto


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    gate = os.environ.get("FLOWRL_TEST_GATE")
    if gate:
        g = Path(gate)
        arm = g / "arm_when"
        if arm.is_file() and Path(arm.read_text().strip()).exists() and not (g / "fired").exists():
            (g / "fired").touch()
            (g / "blocked").touch()
            deadline = time.monotonic() + 120
            while not (g / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
    return auto(data_source, solution_str, ground_truth, extra_info)

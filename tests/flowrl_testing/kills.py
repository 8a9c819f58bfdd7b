"""Fault injection for crash tests: a gate that holds a step at a known point (the reward
function ``tests/dist/gated_reward.py``), and the processes a killed driver left behind."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

DIST = Path(__file__).resolve().parents[1] / "dist"
GATED = "algorithm.reward_fn=gated_reward:compute_score"  # scores as auto; holds one reward call


def arm_gate(tmp_path: Path, monkeypatch, run_dir: Path) -> Path:
    """Hold the first reward call made once ``run_dir``'s first checkpoint exists (workers and
    subprocesses import ``gated_reward`` through ``PYTHONPATH``); returns the gate directory
    (``blocked`` appears when the call is held, touch ``release`` to let it go)."""
    monkeypatch.syspath_prepend(str(DIST))
    monkeypatch.setenv("PYTHONPATH", str(DIST) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "arm_when").write_text(str(run_dir / "checkpoints" / "latest"))
    monkeypatch.setenv("FLOWRL_TEST_GATE", str(gate))
    return gate


def wait_for(path: Path, timeout_s: float, proc: subprocess.Popen | None = None) -> bool:
    """Whether ``path`` appeared within ``timeout_s`` (False early if ``proc`` ended)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
            return False
        time.sleep(0.05)
    return True


def alive_in_group(pgid: int) -> list[str]:
    """``ps`` lines of the live (not zombie) processes of process group ``pgid``."""
    ps = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if line.split()[1:2] and not line.split()[1].startswith("Z")]


def wait_group_empty(pgid: int, timeout_s: float) -> list[str]:
    """Wait until nothing of process group ``pgid`` runs; what still runs at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (left := alive_in_group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left

"""Abnormal ends are fast (issue 18): SIGTERM, SIGINT and a failing reward function end
``flowrl train`` within seconds (the teardown is parallel and waits for no call a failed graph
reserved), with no process left; SIGUSR1 (``trainer.save_on_signal``) checkpoints after the
step in flight and exits 0, and the same command run again resumes there.

The bounds are generous (a loaded 2-core machine); the measured figures are printed (-s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parents[1])
SIGNAL_EXIT_S = 20.0  # the target is 10 s; a loaded machine gets twice that
FAILURE_EXIT_S = 30.0  # the target is 15 s
FAILING = "algorithm.reward_fn=flowrl_testing.failing_reward:compute_score"


def _args(run_dir: Path, model_dir: Path, data: tuple[Path, Path], *extra: str) -> list[str]:
    return [f"model.path={model_dir}", f"data.train_files={data[0]}", f"trainer.run_dir={run_dir}",
            "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4", "trainer.progress=false",
            "trainer.total_training_steps=40", *extra]


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join([TESTS, env.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, "-m", "flowrl.cli", "train", *args], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_a_step(proc: subprocess.Popen, run_dir: Path, timeout_s: float = 400) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while not (metrics.is_file() and metrics.stat().st_size > 0):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no step within {timeout_s:.0f}s"
        time.sleep(0.05)


def _finish(proc: subprocess.Popen, timeout_s: float) -> tuple[str, str]:
    """Wait for the driver; then nothing of its process group may be left running."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while (left := _alive_in_group(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"
    return out, err


def _alive_in_group(pgid: int) -> list[str]:
    ps = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if line.split()[1:2] and not line.split()[1].startswith("Z")]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_ends_the_run_within_seconds(tmp_path, tiny_model_dir, addition_data, name):
    run_dir = tmp_path / name
    proc = _start(_args(run_dir, tiny_model_dir, addition_data, "trainer.save_on_signal="))
    _wait_for_a_step(proc, run_dir)  # a step in flight: its calls are queued on the ranks
    time.sleep(0.5)
    sent = time.monotonic()
    os.kill(proc.pid, getattr(signal, name))
    _, err = _finish(proc, 120)
    took = time.monotonic() - sent
    print(f"\n{name}: the run ended {took:.1f}s after the signal (rc {proc.returncode})")
    assert proc.returncode == {"SIGTERM": 128 + signal.SIGTERM, "SIGINT": 130}[name], err[-3000:]
    assert took < SIGNAL_EXIT_S, f"{name}: {took:.1f}s"


@pytest.mark.timeout(900)
def test_sigusr1_checkpoints_and_exits_0_a_rerun_resumes_and_a_failure_ends_it_fast(
        tmp_path, tiny_model_dir, addition_data):
    run_dir = tmp_path / "preempted"
    args = _args(run_dir, tiny_model_dir, addition_data)  # trainer.save_on_signal=USR1: the default
    proc = _start(args)
    _wait_for_a_step(proc, run_dir)
    os.kill(proc.pid, signal.SIGUSR1)
    _, err = _finish(proc, 300)
    assert proc.returncode == 0, err[-3000:]
    assert "SIGUSR1: stopped after step" in err
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert saved, "no checkpoint saved on SIGUSR1"
    next_step = int(saved[-1].split("_")[1])
    assert next_step >= 1

    # The same command again resumes there; its reward function then fails (a real error): the
    # run ends with the error soon after, not after a teardown timeout per worker group.
    marker = run_dir / "metrics.jsonl"
    proc = _start(args + [FAILING], env={"FLOWRL_TEST_FAIL_AFTER": str(marker)})
    out, err = _finish(proc, 400)
    took = time.time() - float(Path(str(marker) + ".raised").read_text())
    print(f"\nfailure: the run ended {took:.1f}s after the reward function raised (rc {proc.returncode})")
    assert f"resumed from step {next_step}" in out, out[-2000:]
    assert proc.returncode == 1 and "fails on purpose" in err, err[-3000:]
    assert took < FAILURE_EXIT_S, f"{took:.1f}s"

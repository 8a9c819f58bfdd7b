"""Crash recovery (dp): a worker killed mid-run, and a driver killed and started again.

Both runs must end in exactly the state of an uninterrupted run: every step's metrics row and
experience Parquet exactly once, the compared metrics of every step and the final checkpoint's
parameters and optimizer state bitwise equal (fp32, same layout; data order and sampling seeds
are functions of (seed, step), so the steps run again after the checkpoint repeat exactly).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from flowrl.checkpoint import latest_checkpoint, load_full, load_meta
from flowrl.config import load_config
from flowrl.config.pools import HYBRID_GROUP
from flowrl.run import train

STEPS = 3
COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean")


def _args(run_dir, model_dir, data, *extra):
    return [
        f"model.path={model_dir}", f"data.train_files={data[0]}", f"trainer.run_dir={run_dir}",
        "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4", "trainer.progress=false",
        f"trainer.total_training_steps={STEPS}", "trainer.save_freq=2", "actor.entropy_coeff=0.01", *extra,
    ]


GATED = "algorithm.reward_fn=gated_reward:compute_score"  # scores as auto; holds step 2 (tests/dist/gated_reward.py)


def _gate(tmp_path, monkeypatch, run_dir):
    """Arm gated_reward: hold the first reward call made once ``run_dir``'s first checkpoint exists."""
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.syspath_prepend(here)  # workers are spawned with this sys.path
    monkeypatch.setenv("PYTHONPATH", here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "arm_when").write_text(str(run_dir / "checkpoints" / "latest"))
    monkeypatch.setenv("FLOWRL_TEST_GATE", str(gate))
    return gate


def _wait_for(path, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir, addition_data):
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    train(load_config(None, _args(run_dir, tiny_model_dir, addition_data)))
    return run_dir


def _assert_same_run(run_dir, reference):
    rows, ref = _rows(run_dir), _rows(reference)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # each step exactly once, in order
    for r, q in zip(rows, ref):
        for key in COMPARED:
            assert r[key] == q[key], (r["step"], key, r[key], q[key])
    files = sorted(p.name for p in (run_dir / "experience").iterdir())
    assert files == [f"step_{s:06d}.parquet" for s in range(1, STEPS + 1)], files  # verl's numbering
    ca, cb = latest_checkpoint(run_dir / "checkpoints"), latest_checkpoint(reference / "checkpoints")
    assert ca.endswith(f"step_{STEPS:08d}") and cb.endswith(f"step_{STEPS:08d}")
    assert load_meta(ca)["extra"]["optim_step"] == load_meta(cb)["extra"]["optim_step"] == STEPS
    for state in (None, "exp_avg", "exp_avg_sq"):
        pa, pb = load_full(ca, state=state, as_torch=True), load_full(cb, state=state, as_torch=True)
        assert pa.keys() == pb.keys()
        for name in pa:
            assert torch.equal(pa[name], pb[name]), (state, name)  # bitwise


@pytest.mark.timeout(600)
def test_killed_worker_is_replaced_and_the_run_matches_an_uninterrupted_one(
        tmp_path, tiny_model_dir, addition_data, uninterrupted, caplog, monkeypatch):
    from distributed import default_client

    from flowrl.run.recovery import rank_pids

    run_dir = tmp_path / "killed_worker"
    gate = _gate(tmp_path, monkeypatch, run_dir)
    killed: list[int] = []

    def watcher() -> None:  # step 2 is held in its reward node (after step 2's checkpoint): kill -9 actor rank 0
        if not _wait_for(gate / "blocked", 300):
            return
        # the default placement (auto -> hybrid): actor rank 0 shares its process with rollout and ref rank 0
        pid = rank_pids(default_client())[(HYBRID_GROUP, 0)]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        time.sleep(0.5)
        (gate / "release").touch()  # the step goes on to the update, on the dead rank

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    with caplog.at_level("WARNING", logger="flowrl.run.recovery"):
        summary = train(load_config(None, _args(run_dir, tiny_model_dir, addition_data, GATED)))
    thread.join(timeout=10)
    assert killed, "the watcher never killed a worker"
    assert summary.restarts == 1
    assert any("restart 1/3" in r.getMessage() and f"{HYBRID_GROUP}[0]" in r.getMessage() for r in caplog.records)
    assert summary.steps == STEPS  # step 2's lost attempt is not in the history
    _assert_same_run(run_dir, uninterrupted)


@pytest.mark.timeout(600)
def test_killed_controller_is_replaced_and_the_run_matches_an_uninterrupted_one(
        tmp_path, tiny_model_dir, addition_data, uninterrupted, caplog, monkeypatch):
    """kill -9 of the worker that runs the graph's nodes (``cluster.controller=worker``; step 2's
    reward node is running on it):
    the step's graph is cancelled at once (not left pinned to the dead address), the recovery
    reports ``controller`` and rebuilds, and every step runs exactly once."""
    from distributed import default_client

    from flowrl.run.recovery import controller_pid

    run_dir = tmp_path / "killed_controller"
    gate = _gate(tmp_path, monkeypatch, run_dir)
    killed: list[int] = []

    def watcher() -> None:  # the gate holds step 2's reward node, on the controller: kill that process
        if _wait_for(gate / "blocked", 300):
            pid = controller_pid(default_client())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    with caplog.at_level("WARNING", logger="flowrl.run.recovery"):
        summary = train(load_config(None, _args(run_dir, tiny_model_dir, addition_data, GATED,
                                                "cluster.timeout_s=120", "cluster.controller=worker")))
    thread.join(timeout=10)
    assert killed, "the watcher never killed the controller"
    assert summary.restarts == 1
    assert any("restart 1/3" in r.getMessage() and "controller" in r.getMessage() for r in caplog.records)
    assert summary.steps == STEPS
    _assert_same_run(run_dir, uninterrupted)


@pytest.mark.timeout(600)
def test_killed_driver_restarted_with_resume_auto_matches_an_uninterrupted_one(
        tmp_path, tiny_model_dir, addition_data, uninterrupted, monkeypatch):
    run_dir = tmp_path / "killed_driver"
    gate = _gate(tmp_path, monkeypatch, run_dir)
    args = _args(run_dir, tiny_model_dir, addition_data)
    cmd = [sys.executable, "-m", "flowrl.cli", "train", *args, GATED]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not (gate / "blocked").exists():  # step 2 in flight, after step 2's checkpoint
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "step 2 never started within 300s"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # the driver only; its workers notice and exit
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        time.sleep(1.0)
        try:  # whatever the driver started and left behind (its own process group)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / "checkpoints" / f"step_{STEPS:08d}").exists()  # killed before the end
    summary = train(load_config(None, args + ["trainer.resume_mode=auto"]))
    assert summary.steps == STEPS - 2  # steps 0 and 1 came from the checkpoint
    _assert_same_run(run_dir, uninterrupted)

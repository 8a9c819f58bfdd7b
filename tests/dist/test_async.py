"""Asynchronous RL end to end (trainer.staleness), on the embedded default task (a warmed-up
tiny model that scores sometimes, so the weights move and a version behind differs).

- GRPO, staleness 1, a checkpoint every 2 steps: each sample's ``weight_version`` is one step
  behind except after a checkpoint (the pipeline drains there); a run killed after step 2 (with
  step 3's generation in flight) and resumed repeats the uninterrupted run exactly, and every
  prompt is trained exactly once per step it belongs to (none lost, none twice).
- PPO (a critic), staleness 1, one critic-warmup step and the rollout correction applied.
- Kill tests, with staleness 1 and with the stream mode (partial rollouts on): the driver killed
  with SIGKILL while step 2 is in flight (held in its reward by ``gated_reward``), nothing of its
  process group left, the same command resumed; and a worker (actor rank 0) killed with SIGKILL
  in flight, the run rebuilt from its checkpoint. Either way every prompt is trained exactly once
  with its ``rollout.n`` samples and every step is in ``metrics.jsonl`` once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter

import pyarrow.parquet as pq
import pytest

from flowrl.config import load_config
from flowrl.data import experience as ex
from flowrl.run import train

BASE = ["data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=8", "trainer.progress=false",
        "actor.use_kl_loss=false"]


def _cfg(run_dir, model_dir, data, steps, *extra):
    return load_config(None, [f"model.path={model_dir}", f"data.train_files={data[0]}", f"trainer.run_dir={run_dir}",
                              f"trainer.total_training_steps={steps}", *BASE, *extra])


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _steady(row):  # what is not a time (nor the previous step's weight sync, which a resumed run lacks)
    return {k: v for k, v in row.items() if not k.startswith(("timing_s/", "timing_per_token_ms/", "compute_s/", "perf/",
                                                               "async/", "reshard/", "checks/weight_sync",
                                                               "checks/engine_moved"))
            and not k.endswith("_s")}


@pytest.fixture(scope="module")
def default_task():
    from flowrl.tasks.default_task import prepare_default_task
    from flowrl.run import default_cache_dir

    return prepare_default_task(default_cache_dir() / "default_task")


class Killed(BaseException):
    """Stands for the driver's death (not an error the recovery would handle)."""


@pytest.mark.timeout(600)
def test_staleness_one_lags_a_version_and_a_killed_run_resumes_exactly(tmp_path, default_task):
    model_dir, data = default_task.model_dir, [default_task.train_path]
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    extra = ("trainer.staleness=1", "trainer.save_freq=2")
    train(_cfg(a_dir, model_dir, data, 4, *extra))
    rows = _rows(a_dir)
    # steps 1, 2 start the pipeline (versions 0, 0); step 2 is a checkpoint step, so step 3 waits
    # for its weights (version 2) and step 4 runs one behind again (version 2)
    versions = [set(pq.read_table(ex.step_path(a_dir, s)).column("weight_version").to_pylist()) for s in range(1, 5)]
    assert versions == [{0}, {0}, {2}, {2}]
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 0.0, 1.0]
    assert all("async/rollout_idle_s" in r and "async/trainer_idle_s" in r for r in rows[1:])

    def kill_after_step_2(step, metrics):
        if step == 3:  # step 4's generation is in flight now
            raise Killed

    with pytest.raises(Killed):
        train(_cfg(b_dir, model_dir, data, 4, *extra), on_step=kill_after_step_2)
    resumed = train(_cfg(b_dir, model_dir, data, 4, *extra, "trainer.resume_mode=auto"))
    assert resumed.steps == 2  # steps 3 and 4 again, from the checkpoint after step 2
    b_rows = _rows(b_dir)
    assert [r["training/global_step"] for r in b_rows] == [1.0, 2.0, 3.0, 4.0]
    assert [_steady(r) for r in b_rows] == [_steady(r) for r in rows]  # bitwise, the same numbers

    seen = Counter()
    for s in range(1, 5):
        a_tab, b_tab = pq.read_table(ex.step_path(a_dir, s)), pq.read_table(ex.step_path(b_dir, s))
        assert a_tab.column("prompt_ids").to_pylist() == b_tab.column("prompt_ids").to_pylist()
        assert a_tab.column("response_ids").to_pylist() == b_tab.column("response_ids").to_pylist()
        seen.update(b_tab.column("group").to_pylist())  # one id per prompt
    assert len(seen) == 4 * 8 and set(seen.values()) == {4}  # each prompt once, with its rollout.n samples


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["staleness", "stream"])
def test_ppo_with_staleness_critic_warmup_and_rollout_correction(tmp_path, default_task, mode):
    model_dir, data = default_task.model_dir, [default_task.train_path]
    stream = ("trainer.async_mode=stream",) if mode == "stream" else ()  # requests of 2 prompts, a queue of 2 batches
    cfg = _cfg(tmp_path / "run", model_dir, data, 3, "algorithm.adv_estimator=gae",
               "critic.ppo_mini_batch_size=8", "trainer.staleness=1", "trainer.critic_warmup=1",
               "algorithm.rollout_is_threshold=2.0", "algorithm.rollout_is=true", *stream)
    train(cfg)
    rows = _rows(tmp_path / "run")
    assert rows[0]["critic/warmup"] == 1.0 and "actor/pg_loss" not in rows[0] and "critic/vf_loss" in rows[0]
    assert all("actor/pg_loss" in r and "critic/vf_loss" in r and "critic/warmup" not in r for r in rows[1:])
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    assert not any(k.startswith("rollout_corr/") for k in rows[0])  # no actor update, nothing to correct
    for r in rows[1:]:
        assert 0 < r["rollout_corr/rollout_is_mean"] and r["rollout_corr/rollout_is_max"] >= r["rollout_corr/rollout_is_min"]
    # step 1 trains on samples of the initial weights, which the warmup left unchanged: only
    # numerics between the engines; step 2's samples are a real update behind
    assert abs(rows[1]["rollout_corr/kl"]) < 1e-4 < abs(rows[2]["rollout_corr/kl"])
    assert all(0 <= r["rollout_corr/rollout_is_ratio_fraction_high"] <= 1 for r in rows[1:])
    if mode == "stream":
        assert all(r["async/stale_samples"] == 0 and "async/queue_depth_max" in r for r in rows)


ASYNC_MODES = {
    "staleness1": ("trainer.staleness=1",),
    "stream": ("trainer.async_mode=stream", "trainer.staleness=1", "trainer.stream_request_size=4",
               "trainer.partial_rollout=true", "trainer.partial_rollout_tokens=2"),
}
KILL_STEPS = 4  # a checkpoint after step 1 (save_freq 2); step 2 is held in its reward, then killed


def _each_prompt_once(run_dir, steps, n=4, batch=8):
    """Every step's row once (verl's numbering, from 1), and every prompt (group id) of steps
    1..steps trained exactly once with its n samples; the samples carry their weight versions."""
    assert [r["step"] for r in _rows(run_dir)] == list(range(1, steps + 1))
    seen = Counter()
    for s in range(1, steps + 1):
        tab = pq.read_table(ex.step_path(run_dir, s))
        assert max(tab.column("weight_version").to_pylist()) <= s - 1
        seen.update(tab.column("group").to_pylist())
    assert sorted(seen) == list(range(steps * batch)) and set(seen.values()) == {n}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", sorted(ASYNC_MODES))
def test_driver_killed_by_sigkill_mid_async_run_resumes_each_prompt_once(tmp_path, default_task, monkeypatch, mode):
    from flowrl_testing.kills import GATED, arm_gate, wait_for, wait_group_empty

    model_dir, data = default_task.model_dir, [default_task.train_path]
    run_dir = tmp_path / "run"
    gate = arm_gate(tmp_path, monkeypatch, run_dir)
    args = [f"model.path={model_dir}", f"data.train_files={data[0]}", f"trainer.run_dir={run_dir}",
            f"trainer.total_training_steps={KILL_STEPS}", "trainer.save_freq=2", *BASE, *ASYNC_MODES[mode]]
    proc = subprocess.Popen([sys.executable, "-m", "flowrl.cli", "train", *args, GATED], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        held = wait_for(gate / "blocked", 600, proc)  # step 2 in flight, after step 1's checkpoint
        assert held, proc.stderr.read().decode()[-3000:] if proc.poll() is not None else "step 2 never started"
        os.kill(proc.pid, signal.SIGKILL)  # the driver process itself; its workers notice and exit
        proc.wait(timeout=30)
        left = wait_group_empty(proc.pid, 90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # never leave a process, even when the check fails
        except ProcessLookupError:
            pass
    assert proc.returncode == -signal.SIGKILL
    assert not left, f"processes left behind by the killed driver: {left}"
    assert [r["step"] for r in _rows(run_dir)] == [1, 2]  # step 3 never finished
    meta = json.loads((run_dir / "checkpoints" / "step_00000002" / "meta.json").read_text())
    if mode == "stream":  # a drain step: the checkpoint's queue is empty, its weights are version 2
        assert meta["extra"]["stream"] == {"weight_version": 2, "next": [2, 0], "queue": []}
    (gate / "release").touch()
    summary = train(load_config(None, args + [GATED, "trainer.resume_mode=auto"]))
    assert summary.steps == KILL_STEPS - 2  # steps 0 and 1 came from the checkpoint
    _each_prompt_once(run_dir, KILL_STEPS)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", sorted(ASYNC_MODES))
def test_worker_killed_mid_async_run_is_rebuilt_and_each_prompt_trained_once(tmp_path, default_task, monkeypatch, mode):
    from distributed import default_client

    from flowrl.run.recovery import rank_pids
    from flowrl_testing.kills import GATED, arm_gate, wait_for

    run_dir = tmp_path / "run"
    gate = arm_gate(tmp_path, monkeypatch, run_dir)
    killed: list[int] = []

    def watcher() -> None:  # step 2 held in its reward (generations of later requests in flight): kill actor rank 0
        if wait_for(gate / "blocked", 600):
            pid = rank_pids(default_client())[("actor", 0)]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            (gate / "release").touch()  # the step goes on to its update, on the dead rank

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    summary = train(_cfg(run_dir, default_task.model_dir, [default_task.train_path], KILL_STEPS, "trainer.save_freq=2",
                         GATED, *ASYNC_MODES[mode]))
    thread.join(timeout=10)
    assert killed, "the watcher never killed a worker"
    assert summary.restarts == 1 and summary.steps == KILL_STEPS
    _each_prompt_once(run_dir, KILL_STEPS)

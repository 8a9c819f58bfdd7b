"""GRPO through the CLI with ``rollout.name=vllm`` (CPU build) on the default addition task:
weights reach the engine through the reshard node after every update (the engine sleeping in
between, colocated mode), the engine's log-probs equal the trainer's, and the reward rises. Runs in the vLLM environment (``test_vllm_env.py``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flowrl.tasks.default_task import prepare_default_task

STEPS = 12


@pytest.fixture(scope="module")
def task():
    # The default task with the "vllm" model preset (head_dim 32: vLLM's CPU attention has no
    # kernel for the default preset's head_dim 8). Cached like the default task.
    cache = Path(os.environ.get("FLOWRL_CACHE_DIR", Path.home() / ".cache" / "flowrl"))
    return prepare_default_task(cache / "default_task_vllm", preset="vllm")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, task):
    out = tmp_path_factory.mktemp("grpo_vllm") / "run"
    cmd = [
        sys.executable, "-m", "flowrl.cli", "train",
        f"model.path={task.model_dir}", f"data.train_files={task.train_path}", f"trainer.run_dir={out}",
        "rollout.name=vllm", "rollout.enforce_eager=true", "rollout.data_parallel_size=1",
        "actor.data_parallel_size=1", "actor.use_kl_loss=false",
        f"trainer.total_training_steps={STEPS}", "data.train_batch_size=32", "rollout.n=8",
        "actor.ppo_mini_batch_size=16",  # two optimizer steps per batch: the old-log-prob pass runs
        # colocated mode: the engine sleeps after each generation (on CPU vLLM pauses, frees
        # nothing) and the reshard wakes it
        "rollout.free_cache_engine=true",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=450)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"done: {STEPS} steps" in proc.stdout
    print(proc.stdout.splitlines()[-1])
    return out


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_engine_logprobs_equal_the_trainers_after_every_reshard(run_dir):
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        # step k generates with the weights the reshard delivered after update k-1
        assert ("timing_s/reshard" in row) == (row["step"] > 1)
        assert "timing_s/rollout_sleep" in row
        assert row["rollout/logprob_diff_max"] < 1e-4, row["rollout/logprob_diff_max"]


def test_reward_rises(run_dir):
    scores = [r["critic/score/mean"] for r in _rows(run_dir)]
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    print(f"critic/score/mean first 3 steps {first:.3f} -> last 3 steps {last:.3f}: {scores}")
    assert last > first + 0.05, scores

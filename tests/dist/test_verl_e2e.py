"""A verl user's command line and YAML, unchanged, through ``flowrl train`` on a tiny model:
verl's run_qwen2-7b.sh argument list as published (plus what its ``$@`` appends to point it at
local files and CPU sizes), verl's own ppo_trainer.yaml with a few overrides, and the
``resumed from step N (path)`` line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from flowrl.config.verl_yaml import verl_config_dir
from flowrl_testing.verl import RUN_QWEN2_7B, tiny_overrides, write_gsm8k_style

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ENV = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def _train(args: list[str], timeout: int = 800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowrl.cli", "train", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    root = tmp_path_factory.mktemp("gsm8k")
    return write_gsm8k_style(root / "train.parquet", 32), write_gsm8k_style(root / "test.parquet", 8, split="test")


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_qwen2_7b_arguments_train_two_steps(tmp_path, tiny_model_dir, gsm8k):
    run_dir = tmp_path / "run"
    extra = tiny_overrides(tiny_model_dir, *gsm8k, run_dir)
    if importlib.util.find_spec("wandb") is None:  # the published list logs to wandb
        extra.append("trainer.logger=[console]")
    proc = _train(RUN_QWEN2_7B + extra)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "done: 2 steps" in proc.stdout
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert any(k.startswith("val-core/") for k in rows[-1])  # test_freq=5: and after the last step
    assert "note: actor_rollout_ref.model.use_remove_padding=True: accepted" in proc.stderr
    if importlib.util.find_spec("wandb") is not None:
        assert list((run_dir / "wandb").glob("offline-run-*"))


@pytest.mark.skipif(verl_config_dir() is None, reason="verl's config tree is absent: pip install --no-deps verl==0.9.1")
def test_verl_ppo_trainer_yaml_trains_two_steps(tmp_path, tiny_model_dir, gsm8k):
    run_dir = tmp_path / "run"
    proc = _train([
        str(verl_config_dir() / "ppo_trainer.yaml"), "algorithm.adv_estimator=grpo",
        f"data.train_files={gsm8k[0]}", f"data.val_files={gsm8k[1]}", f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "data.train_batch_size=8", "data.max_response_length=8", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "trainer.n_gpus_per_node=2", "trainer.total_training_steps=2", "trainer.logger=[console]",
        "trainer.test_freq=2", f"trainer.run_dir={run_dir}", "trainer.progress=false",
    ])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "done: 2 steps" in proc.stdout
    rows = _rows(run_dir)
    # val_before_train (verl's default, from the YAML): the untrained policy's validation at step 0,
    # a row of its own (as verl logs it), before training steps 1 and 2
    assert [r["step"] for r in rows] == [0, 1, 2] and any(k.startswith("val-core/") for k in rows[0])
    assert not any(k.startswith(("actor/", "critic/")) for k in rows[0])


def test_a_resumed_run_says_from_which_step_and_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    small = [f"trainer.run_dir={run_dir}", "trainer.save_freq=1", "data.train_batch_size=8", "rollout.n=4",
             "actor.ppo_mini_batch_size=8", "trainer.progress=false"]
    first = _train(small + ["trainer.total_training_steps=1"])
    assert first.returncode == 0, first.stderr[-3000:]
    second = _train(small + ["trainer.total_training_steps=2"])
    assert second.returncode == 0, second.stderr[-3000:]
    line = next(x for x in second.stdout.splitlines() if x.startswith("resumed from step "))
    assert line == f"resumed from step 1 ({run_dir / 'checkpoints' / 'step_00000001'})", line

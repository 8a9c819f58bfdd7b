"""``flowrl train`` with Ulysses sequence parallelism end to end (issue 31 item 2): the default task,
actor and reference on fsdp at 2 ranks split into one sp-2 group, three steps; the same run at sp 1
draws the same samples and its losses agree (the split changes the summation order only). A model
whose heads sp does not divide is refused before any worker starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

STEPS = 3
COMMON = ["actor.strategy=fsdp", f"trainer.total_training_steps={STEPS}", "data.train_batch_size=8", "rollout.n=4",
          "actor.ppo_mini_batch_size=4"]
COMPARED = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl")


def _train(run_dir, *items: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", "train", *COMMON, f"trainer.run_dir={run_dir}", *items],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"done: {STEPS} steps" in proc.stdout
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_default_task_trains_at_sp2_as_unsplit(tmp_path):
    split = _train(tmp_path / "sp2", "actor.ulysses_sequence_parallel_size=2", "ref.ulysses_sequence_parallel_size=2")
    unsplit = _train(tmp_path / "sp1")
    assert [r["step"] for r in split] == list(range(1, STEPS + 1))
    for a, b in zip(split, unsplit):
        assert a["critic/score/mean"] == b["critic/score/mean"]  # the same samples
        assert a["response_length/mean"] == b["response_length/mean"]
        assert a["checks/logprob_agreement_value"] < 1e-4  # rollout and trainer log-probs agree
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)


def test_heads_sp_does_not_divide_are_refused_before_workers(tmp_path, addition_data):
    from conftest import build_tiny_model_dir

    model = build_tiny_model_dir(tmp_path / "three_heads", hidden_size=24, num_heads=3, num_kv_heads=1)
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", "train", *COMMON, f"model.path={model}",
                           f"data.train_files={addition_data[0]}",
                           f"trainer.run_dir={tmp_path / 'run'}", "actor.ulysses_sequence_parallel_size=2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "actor.ulysses_sequence_parallel_size=2: the model's 3 attention heads" in proc.stderr
    assert "placement:" not in proc.stdout  # nothing started

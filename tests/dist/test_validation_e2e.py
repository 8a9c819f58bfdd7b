"""Validation during training: every trainer.test_freq steps, greedy generation on held-out
prompts, val-core metrics in metrics.jsonl, samples under <run_dir>/validation/."""

from __future__ import annotations

import json

import pytest

from flowrl.config import load_config
from flowrl.graphs.validation import samples_path
from flowrl.run import train


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_validation_every_n_steps(tmp_path, tiny_model_dir, addition_data):
    run_dir = tmp_path / "run"
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", f"data.val_files={addition_data[1]}",
        f"trainer.run_dir={run_dir}", "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=3", "trainer.test_freq=2", "data.val_max_samples=8",
        "rollout.data_parallel_size=2", "actor.data_parallel_size=1", "actor.use_kl_loss=false", "trainer.progress=false",
    ])
    train(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    key = "val-core/flowrl/addition/reward/mean@1"
    # after step 2 and after the last step, 3 (verl's numbering: steps trained)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [key in r for r in rows] == [False, True, True]
    for r in rows[1:]:
        assert 0.0 <= r[key] <= 1.0 and r["val-aux/num_samples"] == 8 and "timing_s/validation" in r
    for trained in (2, 3):
        samples = [json.loads(line) for line in samples_path(run_dir, trained).read_text().splitlines()]
        assert len(samples) == 8  # greedy: one response per held-out prompt, split over 2 rollout ranks
        assert {"prompt", "response", "ground_truth", "score", "data_source"} <= set(samples[0])
        assert sum(s["score"] for s in samples) / 8 == pytest.approx(rows[trained - 1][key], abs=1e-6)
    assert not samples_path(run_dir, 1).exists()

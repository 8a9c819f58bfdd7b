"""verl's two rollout-correction catalogue scripts (``examples/rollout_correction/*.sh``: bypass
mode with REINFORCE and batch-normalized sequence weights; bypass mode with PPO clip and
rejection sampling ``token_k1,seq_max_k2``) train two steps on CPU through ``--verl-script``, the
sizes shrunk: no old-log-prob pass runs and the ``rollout_corr/*`` metrics come from the actor's
loss (issue 37)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from flowrl.config.verl_script import expand
from flowrl_testing.verl import tiny_overrides, write_gsm8k_style

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
CATALOGUE = Path(__file__).parents[1] / "unit" / "data" / "verl_example_argv.txt"


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    root = tmp_path_factory.mktemp("gsm8k")
    return write_gsm8k_style(root / "train.parquet", 32), write_gsm8k_style(root / "test.parquet", 8, split="test")


def _train(tmp_path: Path, name: str, model_dir: Path, gsm8k) -> list[dict]:
    line = next(line for line in CATALOGUE.read_text().splitlines() if line.startswith(name + "\t"))
    script = tmp_path / "run.sh"
    script.write_text(f"#!/usr/bin/env bash\nset -xeuo pipefail\npython3 -m verl.trainer.main_ppo "
                      f"{line.split(chr(9), 1)[1]} \"$@\"\n")
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides(model_dir, *gsm8k, run_dir), "actor_rollout_ref.rollout.n=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.logger=[console]",
                 "trainer.test_freq=-1", "data.max_prompt_length=128"]
    argv = expand(["train", "--verl-script", shlex.quote(str(script)), *overrides])
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", *argv], capture_output=True, text=True, timeout=800,
                          env={**os.environ, "WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "done: 2 steps" in proc.stdout
    rows = [json.loads(row) for row in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("compute_s/old_logprobs" not in r for r in rows)  # pi_old := pi_rollout, no actor pass
    config = (run_dir / "config.yaml").read_text()
    assert "rollout_is_bypass: true" in config
    return rows


def test_bypass_reinforce_with_batch_normalized_sequence_weights(tmp_path, tiny_model_dir, gsm8k):
    rows = _train(tmp_path, "examples/rollout_correction/run_with_rollout_corr.sh", tiny_model_dir, gsm8k)
    for r in rows:
        assert r["actor/pg_loss"] == r["actor/pg_loss"]  # finite
        assert r["rollout_corr/rollout_is_batch_norm_factor"] > 0
        assert "rollout_corr/rollout_is_mean" in r


def test_bypass_ppo_clip_with_rejection_sampling(tmp_path, tiny_model_dir, gsm8k):
    rows = _train(tmp_path, "examples/rollout_correction/run_with_rollout_corr_multi_rs.sh", tiny_model_dir, gsm8k)
    for r in rows:
        assert 0.0 <= r["rollout_corr/rollout_rs_masked_fraction"] <= 1.0
        assert "rollout_corr/rollout_rs_token_k1_masked_fraction" in r and "actor/pg_clipfrac" in r

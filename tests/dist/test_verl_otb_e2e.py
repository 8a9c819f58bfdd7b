"""verl's ``examples/otb_trainer/run_qwen2_5-7b.sh`` (``algorithm.adv_estimator=optimal_token_baseline``)
trains two steps on CPU through ``--verl-script`` (issue 37): the actor's pre-update pass gives
``sum_pi_squared`` with the old log-probs, and the advantages are OTB's."""

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
SCRIPT = "examples/otb_trainer/run_qwen2_5-7b.sh"


def test_the_catalogue_otb_script_trains_two_steps(tmp_path, tiny_model_dir):
    train = write_gsm8k_style(tmp_path / "train.parquet", 32)
    val = write_gsm8k_style(tmp_path / "test.parquet", 8, split="test")
    line = next(line for line in CATALOGUE.read_text().splitlines() if line.startswith(SCRIPT + "\t"))
    script = tmp_path / "run.sh"
    script.write_text(f"#!/usr/bin/env bash\nset -xeuo pipefail\npython3 -m verl.trainer.main_ppo "
                      f"{line.split(chr(9), 1)[1]} \"$@\"\n")
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides(tiny_model_dir, train, val, run_dir), "actor_rollout_ref.rollout.n=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.logger=[console]",
                 "trainer.test_freq=-1", "data.max_prompt_length=128"]
    argv = expand(["train", "--verl-script", shlex.quote(str(script)), *overrides])
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", *argv], capture_output=True, text=True, timeout=800,
                          env={**os.environ, "WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "done: 2 steps" in proc.stdout
    assert "adv_estimator: optimal_token_baseline" in (run_dir / "config.yaml").read_text()
    rows = [json.loads(row) for row in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("compute_s/old_logprobs" in r and r["actor/pg_loss"] == r["actor/pg_loss"] for r in rows)

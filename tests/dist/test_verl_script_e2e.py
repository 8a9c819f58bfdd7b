"""A script of verl's example catalogue trains end to end on CPU (issue 37 item 5): the FSDP GRPO
LoRA tuning script (examples/tuning/1.5b/qwen2-1.5b_grpo-lora_1_h100_fsdp_vllm.sh, its argument
list as recorded in tests/unit/data/verl_example_argv.txt) run as a script through
``--verl-script`` (:func:`flowrl.config.verl_script.expand`), with overrides appended that point
it at a tiny model and the embedded GSM8K-style Parquet and shrink the sizes: two steps."""

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
SCRIPT = "examples/tuning/1.5b/qwen2-1.5b_grpo-lora_1_h100_fsdp_vllm.sh"


def test_a_catalogue_fsdp_grpo_script_trains_two_steps(tmp_path, tiny_model_dir):
    line = next(line for line in CATALOGUE.read_text().splitlines() if line.startswith(SCRIPT + "\t"))
    script = tmp_path / "run.sh"
    script.write_text(f"#!/usr/bin/env bash\nset -xeuo pipefail\npython3 -m verl.trainer.main_ppo {line.split(chr(9), 1)[1]} \"$@\"\n")
    train = write_gsm8k_style(tmp_path / "train.parquet", 32)
    val = write_gsm8k_style(tmp_path / "test.parquet", 8, split="test")
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides(tiny_model_dir, train, val, run_dir), "actor_rollout_ref.rollout.n=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size=4", "trainer.logger=[console]"]
    argv = expand(["train", "--verl-script", shlex.quote(str(script)), *overrides])
    # the script's global micro-batch (1 of 128 in the catalogue) and its LoRA reach flowrl as verl means them
    assert "actor_rollout_ref.model.lora_rank=32" in argv and argv[-len(overrides):] == overrides
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", *argv], capture_output=True, text=True, timeout=800,
                          env={**os.environ, "WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "done: 2 steps" in proc.stdout
    rows = [json.loads(row) for row in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["actor/pg_loss"] == r["actor/pg_loss"] for r in rows)
    config = (run_dir / "config.yaml").read_text()
    assert "lora_rank: 32" in config and "ppo_micro_batch_size_per_gpu: 2" in config  # 4 over 2 GPUs

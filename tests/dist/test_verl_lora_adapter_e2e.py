"""verl's ``examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora_from_adapter.sh`` trains two steps
on CPU through ``--verl-script`` from a saved adapter (``model.lora_adapter_path``, issue 37): the
adapter's rank and targets become the run's, and the first update already sees a KL to the
reference (the base model, adapters off), which fresh adapters (B = 0) cannot have."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flowrl.config.verl_script import expand
from flowrl_testing.verl import tiny_overrides, write_gsm8k_style

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
CATALOGUE = Path(__file__).parents[1] / "unit" / "data" / "verl_example_argv.txt"
SCRIPT = "examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora_from_adapter.sh"


def test_the_catalogue_lora_from_adapter_script_trains_from_the_saved_adapter(tmp_path, tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    train = write_gsm8k_style(tmp_path / "train.parquet", 32)
    val = write_gsm8k_style(tmp_path / "test.parquet", 8, split="test")
    line = next(line for line in CATALOGUE.read_text().splitlines() if line.startswith(SCRIPT + "\t"))
    script = tmp_path / "run.sh"
    script.write_text(f"#!/usr/bin/env bash\nset -xeuo pipefail\npython3 -m verl.trainer.main_ppo "
                      f"{line.split(chr(9), 1)[1]} \"$@\"\n")
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides(tiny_model_dir, train, val, run_dir), "actor_rollout_ref.rollout.n=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.logger=[console]",
                 "trainer.test_freq=-1", "trainer.save_freq=-1", "data.max_prompt_length=128",
                 f"actor_rollout_ref.model.lora_adapter_path={adapter}"]
    argv = expand(["train", "--verl-script", shlex.quote(str(script)), *overrides])
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", *argv], capture_output=True, text=True, timeout=800,
                          env={**os.environ, "WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "done: 2 steps" in proc.stdout
    config = (run_dir / "config.yaml").read_text()
    assert "lora_rank: 4" in config and "lora_alpha: 8" in config and str(adapter) in config
    rows = [json.loads(row) for row in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["actor/kl_loss"] > 1e-6  # the policy is base + saved adapter from the first step

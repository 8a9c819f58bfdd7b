"""GRPO with LoRA end to end through the CLI: ``actor.strategy=fsdp model.lora_rank=8`` on 2 ranks,
the reference on the actor (no reference group), merged weights to the hf rollout, a checkpoint of
the adapters, and ``flowrl export-hf --merge-lora`` / ``--adapter-only`` from it."""

import json
import subprocess
import sys

import pytest
import torch


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir, addition_data):
    out = tmp_path_factory.mktemp("lora") / "run"
    cmd = [
        sys.executable, "-m", "flowrl.cli", "train",
        f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", f"trainer.run_dir={out}",
        "trainer.total_training_steps=2", "trainer.save_freq=2", "actor.strategy=fsdp", "model.lora_rank=8",
        "actor.optim.lr=5e-3", "data.train_batch_size=8", "rollout.n=4", "rollout.data_parallel_size=1",
        "actor.ppo_mini_batch_size=4",  # 2 optimizer steps: the old log-probs (adapters on) vs the rollout's
        "actor.entropy_coeff=0.01",  # a gradient even when every score of the random tiny model ties
        "cluster.placement=colocated",  # the rollout in its own process: the merged-weight sync is what is tested
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 2 steps" in proc.stdout
    return out


def test_lora_run_uses_the_actor_as_reference_and_syncs_merged_weights(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert "timing_s/ref" in row and row["actor/kl_loss"] >= 0.0
        # step 1 generates with step 0's merged weights: the rollout's log-probs are the actor's
        # (adapters on) within float error, so the merge in the weight sync is right
        assert row["rollout/logprob_diff_max"] < 1e-4
    assert rows[1]["actor/kl_loss"] > 0.0  # the adapters moved away from the base (the reference)
    config = (run_dir / "config.yaml").read_text()
    assert "lora_rank: 8" in config


def test_export_hf_merge_lora_round_trip(run_dir, tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ckpt = run_dir / "checkpoints" / "step_00000002"
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["extra"]["lora"]["rank"] == 8
    assert all(".lora_A." in n or ".lora_B." in n for n in meta["params"])  # the adapters only
    from flowrl.cli import main

    merged_dir, adapter_dir = tmp_path / "merged", tmp_path / "adapter"
    # the CLI in a subprocess once (the checkpoint's recorded model.path), then in this process
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", "export-hf", str(ckpt), str(merged_dir), "--merge-lora"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert main(["export-hf", str(ckpt), str(adapter_dir), "--adapter-only"]) == 0
    assert main(["export-hf", str(ckpt), str(tmp_path / "x")]) == 2  # a LoRA checkpoint needs one of the two
    ids = torch.tensor([[5, 9, 12, 7, 30, 22]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(merged_dir)(ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        base_logits = base(ids).logits
        adapted = PeftModel.from_pretrained(base, adapter_dir)(ids).logits
    assert torch.allclose(merged, adapted, atol=1e-5)
    assert (merged - base_logits).abs().max() > 1e-4  # training moved the merged model

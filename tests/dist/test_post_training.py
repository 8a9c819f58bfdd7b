"""The supervised families on a real session (the Python API as the run uses it: the family's
groups started by ``start_groups``, each step's graph built by the family and computed): DPO on
addition pairs (actor dp=2 against the reference group; the loss starts at log 2 and falls, the
margins grow), then SFT on addition demonstrations on the same actor
(the training and held-out losses fall); `flowrl train` of the sft family, and of sft then dpo
with LoRA on dp."""

from __future__ import annotations

import math

import pytest
from transformers import AutoTokenizer

from flowrl.config import load_config
from flowrl.graphs.dpo import DPO
from flowrl.graphs.family import BuildContext
from flowrl.graphs.sft import SFT
from flowrl.run.topology import start_groups
from flowrl.tasks.arithmetic import make_pair_rows, make_sft_rows, write_rows

TIMEOUT_S = 120


def _steps(session, family, ctx, data, val, *, num_steps, batch_size):
    """Train ``num_steps`` steps; the held-out metrics before and after, and each step's metrics."""
    before = session.compute(family.validation(ctx, val.table, step=0), timeout=TIMEOUT_S).metrics
    history = []
    for step in range(num_steps):
        result, sync = session.submit(family.build(ctx, data.batch(step, batch_size, seed=0), step=step).outputs)
        history.append(result.result(timeout=TIMEOUT_S).metrics)
        sync.result(timeout=TIMEOUT_S)
    after = session.compute(family.validation(ctx, val.table, step=num_steps), timeout=TIMEOUT_S).metrics
    return before, history, after


@pytest.mark.timeout(300)
def test_dpo_then_sft_train_through_their_graphs(tmp_path, tiny_model_dir):
    files = {name: write_rows(tmp_path / f"{name}.parquet", rows) for name, rows in (
        ("pairs", make_pair_rows(16, 0, "train")), ("val_pairs", make_pair_rows(16, 0, "test")),
        ("sft", make_sft_rows(256, 0, "train")), ("val_sft", make_sft_rows(32, 0, "test")))}
    common = [f"model.path={tiny_model_dir}", "cluster.placement=colocated", "actor.data_parallel_size=2",
              "ref.data_parallel_size=1", "data.train_batch_size=16", "actor.ppo_mini_batch_size=16",
              "actor.ppo_micro_batch_size_per_gpu=4", f"trainer.run_dir={tmp_path / 'run'}"]
    dpo_cfg = load_config(None, common + ["algorithm.family=dpo", f"data.train_files={files['pairs']}",
                                          f"data.val_files={files['val_pairs']}", "actor.optim.lr=5e-3",
                                          "algorithm.dpo.beta=1.0"])
    sft_cfg = load_config(None, common + ["algorithm.family=sft", f"data.train_files={files['sft']}",
                                          f"data.val_files={files['val_sft']}", "actor.optim.lr=3e-3",
                                          "actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=64"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dpo, sft = DPO(dpo_cfg), SFT(sft_cfg)
    session, groups = start_groups(dpo_cfg, dpo.group_specs(), tmp_path / "run")
    try:
        before, history, after = _steps(session, dpo, BuildContext(dpo_cfg, groups, str(tiny_model_dir)),
                                        dpo.load_data(dpo_cfg, tokenizer), dpo.load_data(dpo_cfg, tokenizer, "val"), num_steps=6,
                                        batch_size=16)
        # the policy is its reference at first: every pair's loss is log 2, no margin
        assert history[0]["actor/dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)
        assert history[0]["actor/rewards/margins"] == pytest.approx(0.0, abs=1e-6)
        assert before["val-core/dpo/dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)
        # six passes over the same 16 pairs (measured on one process: 0.69 -> 0.16, margins 0 -> 2.1)
        assert history[-1]["actor/dpo_loss"] < 0.4 and history[-1]["actor/rewards/margins"] > 0.5
        assert history[-1]["actor/rewards/accuracies"] > 0.5
        assert after["val-core/dpo/dpo_loss"] != before["val-core/dpo/dpo_loss"]  # the weights moved
        assert {"actor/rewards/chosen", "actor/rewards/rejected", "actor/rewards/accuracies"} <= set(history[-1])

        # SFT on the same actor group, packed micro-batches of at most 64 tokens
        before, history, after = _steps(session, sft, BuildContext(sft_cfg, groups, str(tiny_model_dir)),
                                        sft.load_data(sft_cfg, tokenizer), sft.load_data(sft_cfg, tokenizer, "val"), num_steps=6,
                                        batch_size=16)
        assert history[-1]["actor/sft_loss"] < history[0]["actor/sft_loss"] - 0.2
        assert after["val-core/sft/sft_loss"] < before["val-core/sft/sft_loss"] - 0.2
        assert history[0]["num_tokens"] > 0
    finally:
        session.close()


@pytest.mark.timeout(300)
def test_flowrl_train_runs_the_sft_family_with_held_out_validation(tmp_path, tiny_model_dir):
    """``flowrl train algorithm.family=sft ...`` as a user runs it (the default placement, auto):
    rows checked before any worker, the held-out loss at step 0 and after the last step, the
    loss logged per step; a file without the family's columns is refused before any worker."""
    import json

    from flowrl.config import ConfigError
    from flowrl.run import resolve_inputs, train

    train_file = write_rows(tmp_path / "sft.parquet", make_sft_rows(64, 0, "train"))
    val_file = write_rows(tmp_path / "val.parquet", make_sft_rows(16, 0, "test"))
    args = [f"model.path={tiny_model_dir}", "algorithm.family=sft", f"data.train_files={train_file}",
            f"data.val_files={val_file}", "data.train_batch_size=16", "actor.ppo_mini_batch_size=16",
            "actor.optim.lr=3e-3", "trainer.total_training_steps=3", "trainer.test_freq=3",
            "trainer.val_before_train=true", "trainer.progress=false", f"trainer.run_dir={tmp_path / 'run'}"]
    summary = train(load_config(None, args))
    assert summary.steps == 3
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # verl's numbering: validation before training at 0
    assert rows[0]["val-core/sft/sft_loss"] > rows[-1]["val-core/sft/sft_loss"]  # it learned, held out
    assert all("actor/sft_loss" in r for r in rows[1:])

    prompts_only = write_rows(tmp_path / "prompts.parquet", [{"prompt": "1+1=", "data_source": "x"}])
    with pytest.raises(ConfigError, match="data.train_files"):
        resolve_inputs(load_config(None, [*args[:2], f"data.train_files={prompts_only}", *args[3:-1],
                                          f"trainer.run_dir={tmp_path / 'bad'}"]))
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()


@pytest.mark.timeout(300)
def test_flowrl_train_runs_sft_then_dpo_with_lora_on_dp(tmp_path, tiny_model_dir):
    """``flowrl train`` with ``model.lora_rank=8`` on dp: SFT trains the adapters (the loss falls,
    the checkpoint exports merged), then DPO from the SFT model with its reference the base model
    (adapters disabled, no ref group): fresh adapters (B = 0) leave the policy equal to its reference,
    so the first step's loss is log 2 with no margin, and the margin grows."""
    import json

    from flowrl.checkpoint.hf_export import export_hf
    from flowrl.run import train

    def run(name, model, extra):
        args = [f"model.path={model}", "model.lora_rank=8", "actor.strategy=dp", "actor.data_parallel_size=1",
                "data.train_batch_size=16", "actor.ppo_mini_batch_size=16", "trainer.total_training_steps=4",
                "trainer.save_freq=4", "trainer.progress=false", f"trainer.run_dir={tmp_path / name}", *extra]
        assert train(load_config(None, args)).steps == 4
        return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    sft_file = write_rows(tmp_path / "sft.parquet", make_sft_rows(64, 0, "train"))
    rows = run("sft", tiny_model_dir, ["algorithm.family=sft", f"data.train_files={sft_file}", "actor.optim.lr=1e-2"])
    assert rows[-1]["actor/sft_loss"] < rows[0]["actor/sft_loss"] - 0.1  # measured: 4.53 -> 4.36
    sft_model = export_hf(tmp_path / "sft" / "checkpoints" / "step_00000004", tmp_path / "sft_model", tiny_model_dir,
                          lora="merge")

    pairs = write_rows(tmp_path / "pairs.parquet", make_pair_rows(16, 0, "train"))
    rows = run("dpo", sft_model, ["algorithm.family=dpo", f"data.train_files={pairs}", "actor.optim.lr=1e-2",
                                  "algorithm.dpo.beta=1.0"])
    assert rows[0]["actor/dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert rows[0]["actor/rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    # measured: loss 0.693 -> 0.532, margins 0 -> 0.40 in 4 steps
    assert rows[-1]["actor/rewards/margins"] > 0.1 and rows[-1]["actor/dpo_loss"] < math.log(2) - 0.05

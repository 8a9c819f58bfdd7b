"""A reward model trained by ``flowrl train algorithm.family=rm`` is the reward of a GRPO run:
its checkpoint exported by ``flowrl export-hf`` is a one-label sequence-classification directory
with the policy's tokenizer, the reward-model role scores with it exactly as the trainer did, and
``reward_model.enable=true reward_model.model_path=<it> reward_model.rule_coef=0`` trains on its
scores alone."""

from __future__ import annotations

import json

import pytest

from flowrl.config import load_config
from flowrl.tasks.arithmetic import make_pair_rows, write_rows


@pytest.mark.timeout(300)
def test_rm_family_checkpoint_exports_to_a_reward_model_that_grpo_trains_on(tmp_path, tiny_model_dir, addition_data):
    import numpy as np
    from transformers import AutoConfig

    from flowrl.checkpoint.hf_export import export_hf
    from flowrl.data.pairs import PairDataset
    from flowrl.roles.reward_model import RewardModelRole
    from flowrl.roles.reward_trainer import RewardTrainerRole
    from flowrl.run import train

    pairs = write_rows(tmp_path / "pairs.parquet", make_pair_rows(32, 0, "train"))
    common = [f"model.path={tiny_model_dir}", "trainer.progress=false", "actor.data_parallel_size=1",
              "rollout.data_parallel_size=1", "ref.data_parallel_size=1"]
    rm_run = tmp_path / "rm_run"
    train(load_config(None, [*common, "algorithm.family=rm", f"data.train_files={pairs}", "data.train_batch_size=8",
                             "actor.ppo_mini_batch_size=8", "actor.optim.lr=3e-3", "trainer.total_training_steps=2",
                             "trainer.save_freq=2", f"trainer.run_dir={rm_run}"]))
    (checkpoint,) = sorted((rm_run / "checkpoints").glob("step_*"))
    out = export_hf(checkpoint, tmp_path / "rm_model", tiny_model_dir)
    config = AutoConfig.from_pretrained(out)
    assert config.architectures == ["Qwen2ForSequenceClassification"] and config.num_labels == 1
    assert (tmp_path / "rm_model" / "tokenizer.json").is_file()

    # the exported model scores as the trained one (the same head, the same last token)
    cfg = load_config(None, [*common, "algorithm.family=rm", f"data.train_files={pairs}"])
    from transformers import AutoTokenizer

    table = PairDataset([str(pairs)], AutoTokenizer.from_pretrained(tiny_model_dir)).table.slice(0, 8)
    trainer = RewardTrainerRole(rank=0, world_size=1, model_dir=str(out), actor=cfg.actor)
    scorer = RewardModelRole(rank=0, world_size=1, model_dir=str(out))
    np.testing.assert_allclose(scorer.compute_rm_scores(table).column("rm_score").to_numpy(),
                               trainer.compute_rm_scores(table).column("rm_score").to_numpy(), atol=1e-5)

    grpo_run = tmp_path / "grpo_run"
    train(load_config(None, [*common, f"data.train_files={addition_data[0]}", "data.train_batch_size=4",
                             "actor.ppo_mini_batch_size=4", "rollout.n=2", "rollout.response_length=4",
                             "reward_model.enable=true", f"reward_model.model_path={out}", "reward_model.rule_coef=0",
                             "trainer.total_training_steps=1", f"trainer.run_dir={grpo_run}"]))
    (row,) = [json.loads(line) for line in (grpo_run / "metrics.jsonl").read_text().splitlines()]
    assert "reward/rm_score/mean" in row and "reward/rule_score/mean" in row
    assert row["critic/score/mean"] == pytest.approx(row["reward/rm_score/mean"], abs=1e-5)  # the RM alone

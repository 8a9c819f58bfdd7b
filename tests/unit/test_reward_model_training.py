"""The rm family's pieces: the Bradley-Terry loss on fixed scores (worked out by hand), and a
trained reward model that :class:`~flowrl.roles.reward_model.RewardModelRole` (RL's
``reward_model.model_path``) loads and scores exactly as the trainer does."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
import torch

from flowrl.algos.rm_loss import RM_LOSS, bradley_terry_loss
from flowrl.algos.supervised import Totals, means
from flowrl.config import ActorConfig, OptimConfig
from flowrl.data import experience as ex


def test_bradley_terry_loss_and_accuracy_by_hand():
    scores = torch.tensor([2.0, 0.0, -1.0, 1.0])  # pair 0: chosen 2 vs 0; pair 1: chosen -1 vs 1
    cu = torch.tensor([0, 1, 2, 3, 4])
    totals = Totals(RM_LOSS.count({}, cu))
    loss, sums = bradley_terry_loss(scores, {}, cu, totals=totals)
    stats = means(sums, totals)
    # -logsigmoid(2) = log(1 + e^-2) = 0.126928; -logsigmoid(-2) = 2.126928; mean 1.126928
    assert totals.denominator == 2.0
    assert loss.item() == pytest.approx((math.log1p(math.exp(-2)) + math.log1p(math.exp(2))) / 2)
    assert stats["accuracy"] == pytest.approx(0.5) and stats["margin"] == pytest.approx(0.0)


def _pairs() -> pa.Table:
    prompts = [[5, 6, 7], [5, 6, 7], [8, 9], [8, 9]]
    responses = [[10, 1], [11, 12, 1], [13, 1], [14, 1]]
    return pa.table({"prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
                     "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
                     "response_mask": ex.from_lists([[1] * len(r) for r in responses], pa.list_(pa.int8()))})


@pytest.mark.slow
def test_a_trained_reward_model_scores_the_same_as_rl_reward_model(tmp_path, tiny_model_dir):
    from flowrl.roles.reward_model import RewardModelRole
    from flowrl.roles.reward_trainer import RewardTrainerRole

    actor = ActorConfig(data_parallel_size=1, ppo_micro_batch_size_per_gpu=1, optim=OptimConfig(lr=1e-2))
    trainer = RewardTrainerRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), actor=actor)
    table = _pairs()
    before = trainer.compute_rm_scores(table).column("rm_score").to_numpy()
    for _ in range(3):
        metrics = trainer.train_pairs(table, mini_batch_rows=4)
    assert metrics["actor/num_optimizer_steps"] == 1.0 and "actor/accuracy" in metrics
    after = trainer.compute_rm_scores(table).column("rm_score").to_numpy()
    margin = lambda s: float((s[0::2] - s[1::2]).mean())  # noqa: E731
    assert margin(after) > margin(before)  # three steps on the same pairs push chosen above rejected
    trainer.save_hf(str(tmp_path / "rm"))
    scored = RewardModelRole(rank=0, world_size=1, model_dir=str(tmp_path / "rm")).compute_rm_scores(table)
    assert scored.column("rm_score").to_numpy() == pytest.approx(after, abs=1e-5)


@pytest.mark.slow
def test_a_lora_reward_model_trains_adapters_and_head_and_exports_a_merged_reward_model(tmp_path, tiny_model_dir):
    """``model.lora_rank`` > 0 in the rm family: only the adapters and the new head train; the
    checkpoint holds both (``extra.lora``), resumes into a fresh role, and ``export-hf
    --merge-lora`` writes a sequence classifier RL's reward model scores exactly as the trainer."""
    from flowrl.checkpoint.hf_export import export_hf
    from flowrl.roles.reward_model import RewardModelRole
    from flowrl.roles.reward_trainer import RewardTrainerRole

    lora = {"rank": 4, "alpha": 8, "target_modules": "all-linear"}
    actor = ActorConfig(data_parallel_size=1, ppo_micro_batch_size_per_gpu=1, optim=OptimConfig(lr=1e-2))
    trainer = RewardTrainerRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), actor=actor, lora=lora)
    trained = sorted(n for n, p in trainer.engine.model.named_parameters() if p.requires_grad)
    assert trained[-1] == "score.modules_to_save.default.weight"
    assert all(".lora_A." in n or ".lora_B." in n for n in trained[:-1]) and len(trained) > 1
    base = {n: p.detach().clone() for n, p in trainer.engine.model.named_parameters() if not p.requires_grad}
    table = _pairs()
    before = trainer.compute_rm_scores(table).column("rm_score").to_numpy()
    for _ in range(3):
        trainer.train_pairs(table, mini_batch_rows=4)
    after = trainer.compute_rm_scores(table).column("rm_score").to_numpy()
    margin = lambda s: float((s[0::2] - s[1::2]).mean())  # noqa: E731
    assert margin(after) > margin(before)
    assert all(torch.equal(p, base[n]) for n, p in trainer.engine.model.named_parameters() if n in base)

    saved = trainer.save_checkpoint(str(tmp_path / "ckpt"), step=3, extra={"next_step": 3})
    resumed = RewardTrainerRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), actor=actor, lora=lora)
    assert resumed.load_checkpoint(saved["path"]) == 3
    assert resumed.compute_rm_scores(table).column("rm_score").to_numpy() == pytest.approx(after, abs=1e-6)
    plain = RewardTrainerRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), actor=actor)
    with pytest.raises(ValueError, match="holds LoRA adapters .* fix: resume with the checkpoint's model.lora_"):
        plain.load_checkpoint(saved["path"])

    out = export_hf(saved["path"], tmp_path / "rm", tiny_model_dir, lora="merge")
    scored = RewardModelRole(rank=0, world_size=1, model_dir=str(out)).compute_rm_scores(table)
    assert scored.column("rm_score").to_numpy() == pytest.approx(after, abs=1e-5)

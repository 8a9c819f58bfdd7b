"""GRPO on the tiny Qwen3-MoE (``model.tiny=moe``) with the megatron backend at EP 2 (dp 2 x ep 2)
on 2 CPU workers (gloo), hf rollout, through the Dask graph: ``actor.megatron.expert_model_parallel_size``
reaches the engine, the rollout's log-probs (transformers) equal megatron's old log-probs before the
update and after each weight sync (experts gathered from both expert-parallel ranks), and each step
logs the MoE statistics with the load-balancing loss that ``moe_aux_loss_coeff`` adds.
"""

import pytest

from flowrl.config import load_config
from flowrl.run import train

pytest.importorskip("megatron.core")


def test_grpo_moe_ep2(tmp_path):
    cfg = load_config(
        None,
        [
            "model.tiny=moe",  # the embedded default task, its model the tiny Qwen3-MoE
            f"trainer.run_dir={tmp_path / 'run'}",
            "trainer.total_training_steps=2",
            "trainer.progress=false",
            "data.train_batch_size=8",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=4",  # two optimizer steps per batch: old log-probs are computed
            "actor.strategy=megatron",
            "actor.data_parallel_size=2",
            "actor.megatron.expert_model_parallel_size=2",
            "actor.megatron.moe_aux_loss_coeff=0.01",
            "rollout.data_parallel_size=1",
            "actor.use_kl_loss=false",
        ],
    )
    summary = train(cfg)
    assert summary.steps == 2
    for metrics in summary.history:
        assert metrics["rollout/logprob_diff_max"] < 1e-4, metrics["rollout/logprob_diff_max"]
        assert metrics["actor/num_optimizer_steps"] == 2
        assert metrics["actor/moe/dropped_tokens"] == 0.0
        assert metrics["actor/moe/expert_load_imbalance"] >= 1.0
        assert 0.0 < metrics["actor/moe/load_balancing_loss"] < 10.0, metrics["actor/moe/load_balancing_loss"]

"""GRPO with the megatron backend at TP2 x PP2 on 4 CPU workers (gloo), through the Dask graph.

The rollout (hf backend) and the trainer (megatron, sharded) must agree on the sampled tokens'
log-probs before the update, and again after each weight sync: that checks the HF <-> Megatron
conversion, the vocab-parallel log-probs and the full-state sync together.
"""

import pytest

from flowrl.config import load_config
from flowrl.run import train

pytest.importorskip("megatron.core")


def test_grpo_tp2_pp2(tmp_path, tiny_model_dir, addition_data):
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            f"data.train_files={addition_data[0]}",
            f"trainer.run_dir={tmp_path / 'run'}",
            "trainer.total_training_steps=2",
            "trainer.progress=false",
            "data.train_batch_size=8",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=4",  # two optimizer steps per batch: old log-probs are computed
            "actor.strategy=megatron",
            "actor.data_parallel_size=1",
            "actor.tensor_model_parallel_size=2",
            "actor.pipeline_model_parallel_size=2",
            "rollout.data_parallel_size=1",
            "actor.use_kl_loss=false",
        ],
    )
    summary = train(cfg)
    assert summary.steps == 2
    for metrics in summary.history:
        # rollout log-probs (transformers) vs megatron's old log-probs of the same weights
        assert metrics["rollout/logprob_diff_max"] < 1e-4, metrics["rollout/logprob_diff_max"]
        assert metrics["actor/num_optimizer_steps"] == 2
        assert metrics["actor/grad_norm"] >= 0

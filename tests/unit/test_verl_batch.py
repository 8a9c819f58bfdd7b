"""verl's batch-size arithmetic (issue 37 item 3): a global micro-batch is divided over the GPUs that
share it, as verl's workers normalise it (:mod:`flowrl.config.verl_batch`)."""

from __future__ import annotations

import pytest

from flowrl.config import ConfigError, load_config
from flowrl.config.verl_batch import num_gpus, per_gpu_micro_batches

AR = "actor_rollout_ref"


def test_a_global_micro_batch_is_split_over_n_gpus_per_node_times_nnodes():
    # 64 samples over 4 GPUs x 2 nodes = 8 GPUs: 64 // 8 = 8 per GPU
    flat = {f"{AR}.actor.ppo_micro_batch_size": 64, "trainer.n_gpus_per_node": 4, "trainer.nnodes": 2}
    assert per_gpu_micro_batches(flat) == {"actor.ppo_micro_batch_size_per_gpu": 8}
    # verl's defaults are 8 GPUs on 1 node: 64 // 8 = 8; one GPU keeps the whole 128 (examples/tuning/1.5b)
    assert num_gpus({}) == 8
    assert per_gpu_micro_batches({f"{AR}.actor.ppo_micro_batch_size": 64}) == {"actor.ppo_micro_batch_size_per_gpu": 8}
    assert per_gpu_micro_batches({f"{AR}.actor.ppo_micro_batch_size": 128, "trainer.n_gpus_per_node": 1}) == {
        "actor.ppo_micro_batch_size_per_gpu": 128}


def test_ulysses_groups_and_megatron_splits_share_a_micro_batch():
    # FSDP with Ulysses 2 on 8 GPUs: 4 groups of 2 GPUs read the same rows: 16 // (8 // 2) = 4
    fsdp = {f"{AR}.actor.ppo_micro_batch_size": 16, f"{AR}.actor.ulysses_sequence_parallel_size": 2,
            "trainer.n_gpus_per_node": 8}
    assert per_gpu_micro_batches(fsdp) == {"actor.ppo_micro_batch_size_per_gpu": 4}
    # Megatron tp 2 x pp 2 on 8 GPUs: 2 data-parallel ranks: 16 // 2 = 8
    megatron = {f"{AR}.actor.strategy": "megatron", f"{AR}.actor.ppo_micro_batch_size": 16,
                f"{AR}.actor.megatron.tensor_model_parallel_size": 2, f"{AR}.actor.megatron.pipeline_model_parallel_size": 2,
                "trainer.n_gpus_per_node": 8}
    assert per_gpu_micro_batches(megatron) == {"actor.ppo_micro_batch_size_per_gpu": 8}


def test_every_global_micro_batch_of_verl_has_its_per_gpu_key():
    flat = {f"{AR}.ref.log_prob_micro_batch_size": 32, "critic.ppo_micro_batch_size": 16,
            "critic.forward_micro_batch_size": 48, "trainer.n_gpus_per_node": 8}
    assert per_gpu_micro_batches(flat) == {"ref.log_prob_micro_batch_size_per_gpu": 4,
                                           "critic.ppo_micro_batch_size_per_gpu": 2,
                                           "critic.forward_micro_batch_size_per_gpu": 6}
    assert per_gpu_micro_batches({f"{AR}.actor.ppo_micro_batch_size": None}) == {}  # verl's default: unset


@pytest.mark.parametrize("flat, problem", [
    ({f"{AR}.actor.ppo_micro_batch_size": 4, "trainer.n_gpus_per_node": 8}, "smaller than the 8 GPUs"),
    ({f"{AR}.actor.ppo_micro_batch_size": 16, f"{AR}.actor.ppo_micro_batch_size_per_gpu": 2}, "both set"),
    ({f"{AR}.actor.ppo_micro_batch_size": 24, f"{AR}.actor.ppo_mini_batch_size": 64}, "does not divide"),
    ({f"{AR}.actor.ppo_micro_batch_size": "many"}, "positive whole number"),
])
def test_what_verl_refuses_is_refused_naming_the_key(flat, problem):
    with pytest.raises(ConfigError) as err:
        per_gpu_micro_batches(flat)
    assert err.value.key == f"{AR}.actor.ppo_micro_batch_size" and problem in err.value.problem


def test_a_verl_command_line_with_a_global_micro_batch_loads():
    cfg = load_config(None, [f"{AR}.actor.ppo_micro_batch_size=32", f"{AR}.ref.log_prob_micro_batch_size=64",
                             f"{AR}.actor.ppo_mini_batch_size=32", "data.train_batch_size=32",
                             "trainer.n_gpus_per_node=2", "trainer.nnodes=2"])
    # 4 GPUs: 32 // 4 = 8 and 64 // 4 = 16 per GPU
    assert cfg.actor.ppo_micro_batch_size_per_gpu == 8 and cfg.ref.log_prob_micro_batch_size_per_gpu == 16

"""The supervised families' settings are refused before any worker starts, naming the key, the
value and the fix; and each family declares the groups it calls."""

from __future__ import annotations

import pytest

from flowrl.config import ConfigError, load_config
from flowrl.graphs.dpo import DPO
from flowrl.graphs.family import resolve_family
from flowrl.graphs.rm import RewardModel
from flowrl.graphs.sft import SFT


def _cfg(*overrides):
    return load_config(None, ["actor.data_parallel_size=2", "data.train_batch_size=8", "actor.ppo_mini_batch_size=4",
                              *overrides])


def test_families_by_name_and_their_groups():
    assert resolve_family(_cfg("algorithm.family=sft")) is SFT
    assert [s.name for s in SFT(_cfg()).group_specs()] == ["actor"]
    dpo = DPO(_cfg()).group_specs()
    assert [s.name for s in dpo] == ["actor", "ref"] and dpo[1].role_kwargs["temperature"] == 1.0
    assert [s.name for s in DPO(_cfg("model.lora_rank=8")).group_specs()] == ["actor"]  # the base model is the reference
    (rm,) = RewardModel(_cfg()).group_specs()
    assert rm.name == "actor" and rm.role_cls == "flowrl.roles.reward_trainer:RewardTrainerRole"


def test_batch_sizes_must_split_evenly_over_the_ranks():
    with pytest.raises(ConfigError, match=r"data.train_batch_size=9: is not divisible by actor.data_parallel_size=2.*"
                                          r"same number of pairs"):
        DPO(load_config(None, ["actor.data_parallel_size=2", "data.train_batch_size=9", "actor.ppo_mini_batch_size=9",
                               "rollout.n=2"]))


def test_pairs_refuse_a_token_budget_and_rm_refuses_what_it_lacks():
    with pytest.raises(ConfigError, match="actor.use_dynamic_bsz=True: the dpo family's micro-batches hold whole"):
        DPO(_cfg("actor.use_dynamic_bsz=true"))
    SFT(_cfg("actor.use_dynamic_bsz=true"))  # conversations pack with the token budget
    megatron = ["actor.strategy=megatron", "actor.tensor_model_parallel_size=2", "actor.data_parallel_size=1",
                "trainer.save_freq=5"]
    (rm,) = RewardModel(_cfg(*megatron)).group_specs()  # the reward model at megatron tp2 (its mesh), checkpointed
    assert (rm.mesh.dp, rm.mesh.tp, rm.mesh.pp) == (1, 2, 1)
    with pytest.raises(ConfigError, match="actor.megatron.param_offload=True: the rm family never generates"):
        RewardModel(_cfg(*megatron, "actor.megatron.param_offload=true"))
    with pytest.raises(ConfigError, match="actor.virtual_pipeline_model_parallel_size=2: the megatron reward model"):
        RewardModel(_cfg(*megatron[:2], "actor.data_parallel_size=1", "actor.pipeline_model_parallel_size=2",
                         "actor.virtual_pipeline_model_parallel_size=2"))
    (rm,) = RewardModel(_cfg("model.lora_rank=8")).group_specs()  # LoRA: adapters and the head train
    assert rm.role_kwargs["lora"]["rank"] == 8


@pytest.mark.parametrize("override,message", [
    ("algorithm.dpo.loss_type=hinge", "algorithm.dpo.loss_type='hinge': is not one of sigmoid, ipo"),
    ("algorithm.dpo.beta=0", "algorithm.dpo.beta=0.0: must be > 0"),
    ("algorithm.sft.max_length=0", "algorithm.sft.max_length=0: must be > 0"),
])
def test_new_keys_are_checked_when_the_config_loads(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [override])

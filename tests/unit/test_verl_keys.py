"""Every leaf of verl 0.9.1's generated trainer configs is classified by the one table
(:mod:`flowrl.config.verl_keys`): mapped, accepted with no effect, or refused by name (issue 37)."""

from __future__ import annotations

from collections import Counter

import pytest

from flowrl.config.verl import classify, translate_item
from flowrl.config.verl_yaml import flatten, verl_config_dir

pytestmark = pytest.mark.skipif(verl_config_dir() is None, reason="verl's config tree is absent: "
                                "pip install --no-deps verl==0.9.1 (as .ci/run does)")
GENERATED = ("_generated_ppo_trainer.yaml", "_generated_ppo_megatron_trainer.yaml")


def leaves(name: str) -> dict:
    from omegaconf import OmegaConf

    return flatten(OmegaConf.to_container(OmegaConf.load(verl_config_dir() / name), resolve=True))


def second_value(value):
    """Another valid value of verl's default: the other boolean, a larger number."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1 if value >= 0 else 1
    if isinstance(value, float):
        return value * 2 if value else 0.5
    return value


@pytest.mark.parametrize("name", GENERATED)
def test_every_leaf_is_classified(name):
    counts = Counter(classify(key)[0] for key in leaves(name))
    assert counts["unknown"] == 0 and sum(counts.values()) > 800, counts


@pytest.mark.parametrize("name", GENERATED)
def test_no_default_value_is_refused_and_a_second_value_is_refused_only_by_name(name):
    from flowrl.config import ConfigError

    for key, value in leaves(name).items():
        if value == "???":
            continue
        cls, entry, _ = classify(key)
        translate_item(key, value)  # verl's default: never refused
        try:
            translate_item(key, second_value(value))
        except ConfigError as exc:
            assert cls == "refused by name" and "in verl:" in exc.problem, (key, exc)


def test_megatron_sizes_map_to_flowrls_megatron_settings():
    assert classify("actor_rollout_ref.actor.megatron.tensor_model_parallel_size")[2] == "actor.tensor_model_parallel_size"
    assert classify("actor_rollout_ref.ref.megatron.pipeline_model_parallel_size")[2] == "ref.pipeline_model_parallel_size"
    assert classify("critic.megatron.tensor_model_parallel_size")[2] == "critic.tensor_model_parallel_size"
    assert classify("actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size")[2] == (
        "actor.virtual_pipeline_model_parallel_size")
    assert classify("actor_rollout_ref.actor.megatron.param_offload")[0] == "refused by name"
    assert classify("actor_rollout_ref.model.use_shm")[0] == "accepted, no effect"

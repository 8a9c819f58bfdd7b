"""A "did you mean" only when it is right (issue 37): the flowrl key the table maps the verl form
of the key to, or the same dotted path under another section, or a typo inside the key's section;
never a key that shares only the last name (``actor_rollout_ref.ref.megatron.tensor_model_parallel_size``
used to get "did you mean rollout.tensor_model_parallel_size?")."""

from __future__ import annotations

import pytest

from flowrl.config import ConfigError, load_config
from flowrl.config.errors import ConfigErrors
from flowrl.config.verl_load import suggest


@pytest.mark.parametrize("key,right", [
    ("actor_rollout_ref.ref.megatron.tensor_model_parallel_size", "ref.tensor_model_parallel_size"),
    ("ref.megatron.tensor_model_parallel_size", "ref.tensor_model_parallel_size"),
    ("actor.megatron.pipeline_model_parallel_size", "actor.pipeline_model_parallel_size"),
    ("critic.megatron.tensor_model_parallel_size", "critic.tensor_model_parallel_size"),
    ("rollout.ppo_mini_batch_size", "actor.ppo_mini_batch_size"),  # the same path under another section
    ("data.response_length", "rollout.response_length"),
    ("actor.optim.lrr", "actor.optim.lr"),  # a typo inside the section
    ("trainer.experiment", "trainer.experiment_name"),
])
def test_a_right_suggestion(key, right):
    hint = suggest(key)
    assert hint.startswith(f"did you mean {right}"), hint


@pytest.mark.parametrize("key", [
    "reward_model.megatron.pipeline_model_parallel_size",  # only the last name is shared with rollout's, actor's
    "ref.megatron.grad_offload_bytes",
    "algorithm.optim.lr_scheduler",
])
def test_no_suggestion_from_the_last_name_alone(key):
    hint = suggest(key)
    last = key.rsplit(".", 1)[-1]
    assert not any(f"{section}.{last}" in hint for section in ("rollout", "actor", "ref", "critic")), hint


def test_the_whole_key_is_named_with_its_right_suggestion():
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        load_config(None, ["ref.megatron.tensor_model_parallel_size=2", "reward_model.megatron.param_offload=true"])
    text = str(err.value)
    assert "ref.megatron.tensor_model_parallel_size=2: unknown key; fix: did you mean ref.tensor_model_parallel_size?" in text
    assert "reward_model.megatron.param_offload=True: unknown key" in text
    assert "reward_model.model_path" not in text and "rollout." not in text, text

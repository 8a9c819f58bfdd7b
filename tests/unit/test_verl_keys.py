"""Every leaf of verl 0.9.1's generated trainer configs is classified by the one table
(:mod:`flowrl.config.verl_keys`): mapped, accepted with no effect, or refused by name (issue 37)."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import pytest

from flowrl.config import ConfigError
from flowrl.config.verl import classify, translate_item
from flowrl.config.verl_yaml import flatten, verl_config_dir

pytestmark = pytest.mark.skipif(verl_config_dir() is None, reason="verl's config tree is absent: "
                                "pip install --no-deps verl==0.9.1 (as .ci/run does)")
GENERATED = ("_generated_ppo_trainer.yaml", "_generated_ppo_megatron_trainer.yaml")


def leaves(name: str) -> dict:
    from omegaconf import OmegaConf

    return flatten(OmegaConf.to_container(OmegaConf.load(verl_config_dir() / name), resolve=True))


#: a second value verl accepts where the leaf's type alone does not give one (enumerations,
#: typed strings, lists), by verl key (a tuple: the first that is not the default)
SECOND = {
    "actor_rollout_ref.actor.optim.betas": [0.9, 0.95],
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine",
    "actor_rollout_ref.actor.strategy": ("megatron", "fsdp"),
    "critic.strategy": ("megatron", "fsdp"),
    "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
    "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
    "critic.loss_agg_mode": "seq-mean-token-mean",
    "actor_rollout_ref.actor.kl_loss_type": "mse",
    "actor_rollout_ref.rollout.dtype": "float32",
    "actor_rollout_ref.model.target_modules": ["q_proj", "v_proj"],
    "data.train_files": ["a.parquet", "b.parquet"],
    "data.val_files": "test.parquet",
    "data.truncation": "left",
    "algorithm.adv_estimator": "grpo",
    "algorithm.filter_groups.metric": "seq_final_reward",
    "algorithm.kl_penalty": "low_var_kl",
    "algorithm.kl_ctrl.type": "adaptive",
    "trainer.logger": "console",
    "trainer.resume_mode": "disable",
    "trainer.device": "cpu",
    "actor_rollout_ref.actor.optim.warmup_style": "cosine",
    "critic.optim.warmup_style": "cosine",
    "actor_rollout_ref.rollout.name": "sglang",
    "actor_rollout_ref.rollout.top_p": 0.9,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 0.9,
    "algorithm.gamma": 0.99,
    "algorithm.lam": 0.95,
    "sandbox_fusion.url": "http://localhost:8080",
    "reward.sandbox_fusion.url": "http://localhost:8080",
    # verl's default pipeline size is 1, and Megatron interleaves stages only over several: no split
    **{f"{role}.megatron.virtual_pipeline_model_parallel_size": 1
       for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")},
}
#: leaves whose second value is valid in verl only together with another key (so is it in flowrl)
TOGETHER = {"reward_model.enable": "reward_model.model.path, null in verl's defaults"}


def second_value(key: str, value):
    """Another valid value of verl's default ``value`` of ``key``: the other boolean, a larger
    number, another string, list or mapping (:data:`SECOND` where verl takes only some)."""
    if key in SECOND:
        options = SECOND[key] if isinstance(SECOND[key], tuple) else (SECOND[key],)
        return next(o for o in options if o != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1 if value >= 0 else 1
    if isinstance(value, float):
        return value * 2 if value else 0.5
    if isinstance(value, str):
        return f"{value}_2" if value else "x"
    if isinstance(value, list):
        return value[:1] if len(value) > 1 else [*value, "x"]
    if isinstance(value, dict):
        return {**value, "x": 1}
    return _second_of_null(key)


def _second_of_null(key: str):
    """A value for a leaf verl leaves null: of the flowrl field's type where it maps to one."""
    from flowrl.config.verl import _field_type, lookup

    kind = _field_type(lookup(key)[1] or key)
    for name, value in (("bool", True), ("int", 2), ("float", 0.5), ("list", ["x"]), ("dict", {"x": 1})):
        if name in kind:
            return value
    return "x"


NAMED = ("in verl:", "flowrl lacks", "flowrl has no equivalent", "is not built", "not built in flowrl")


@lru_cache(maxsize=2)
def verl_context(name: str) -> dict[str, dict]:
    """verl's defaults of ``name``, translated, by flowrl section (``"rollout"``: ``{"name": "vllm",
    ...}``): the rest of a section around the leaf under test, as in verl (its rollout is vLLM, the
    Megatron config's actor is Megatron)."""
    out: dict[str, dict] = {}
    for key, value in leaves(name).items():
        try:
            target, value = _translated(key, "vllm" if value == "???" else value)
        except ConfigError:
            continue
        if target is not None and value is not None:
            section, _, field = target.rpartition(".")
            out.setdefault(section, {})[field] = value
    return out


def _translated(key: str, value):
    """``(flowrl key or None, value as flowrl reads it)`` of verl ``key=value``."""
    from flowrl.config.verl import DROP, alias, verl_value

    target, _ = translate_item(key, value)
    if target is None:
        return None, None
    value = verl_value(key, target, alias(target, value))
    return (None, None) if value is DROP else (target, value)


def accepted_or_named(key: str, value, context: dict[str, dict]) -> str:
    """``accepted`` when verl key ``key`` at ``value`` sets a flowrl field that takes the value (its
    type, and its section's own checks with verl's ``context`` around it), or sets none (no effect,
    derived); ``named`` when refused naming what flowrl lacks; any other refusal fails."""
    import typing

    from flowrl.config.loader import _coerce
    from flowrl.config.schema import RunConfig

    try:
        target, value = _translated(key, value)
        if target is None:
            return "accepted"
        *parents, name = target.split(".")
        section = RunConfig
        for part in parents:
            section = typing.get_type_hints(section)[part]
        hints = typing.get_type_hints(section)
        around = {f: _coerce(hints[f], v, f) for f, v in context.get(".".join(parents), {}).items() if f in hints}
        section(**{**around, name: _coerce(hints[name], value, target)})
    except ConfigError as exc:
        assert any(word in str(exc) for word in NAMED), (key, value, str(exc))
        return "named"
    return "accepted"


@pytest.mark.parametrize("name", GENERATED)
def test_every_leaf_is_classified(name):
    counts = Counter(classify(key)[0] for key in leaves(name))
    assert counts["unknown"] == 0 and sum(counts.values()) > 800, counts


@pytest.mark.parametrize("name", GENERATED)
def test_every_leaf_at_verls_default_is_accepted_and_at_a_second_value_accepted_or_refused_by_name(name):
    """Every leaf, booleans, numbers, strings, lists, mappings and nulls alike, goes through the
    table, verl's value rules and the flowrl field's type and section checks."""
    outcomes, context = Counter(), verl_context(name)
    for key, value in leaves(name).items():
        if value == "???":  # verl's mandatory rollout.name: no default to accept
            value = "vllm"
        assert accepted_or_named(key, value, context) == "accepted", (key, value)
        if key in TOGETHER:
            continue
        second = second_value(key, value)
        assert second != value, key
        outcomes[(type(value).__name__, accepted_or_named(key, second, context))] += 1
    for kind in ("bool", "int", "float", "str", "list", "dict", "NoneType"):
        assert outcomes[(kind, "accepted")] > 0, (kind, outcomes)  # each kind of leaf is exercised


def test_megatron_sizes_map_to_flowrls_megatron_settings():
    assert classify("actor_rollout_ref.actor.megatron.tensor_model_parallel_size")[2] == "actor.tensor_model_parallel_size"
    assert classify("actor_rollout_ref.ref.megatron.pipeline_model_parallel_size")[2] == "ref.pipeline_model_parallel_size"
    assert classify("critic.megatron.tensor_model_parallel_size")[2] == "critic.tensor_model_parallel_size"
    assert classify("actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size")[2] == (
        "actor.virtual_pipeline_model_parallel_size")
    for role in ("actor", "ref"):  # megatron's offload switches are flowrl's (issue 28); the critic's refused
        for switch in ("param_offload", "grad_offload", "optimizer_offload"):
            assert classify(f"actor_rollout_ref.{role}.megatron.{switch}")[2] == f"{role}.megatron.{switch}"
    assert classify("critic.megatron.param_offload")[0] == "refused by name"
    assert classify("actor_rollout_ref.model.use_shm")[0] == "accepted, no effect"

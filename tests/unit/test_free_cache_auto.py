"""``rollout.free_cache_engine=auto`` (issue 29; verl's default is true): on where the engine
shares the trainer's devices and can sleep and generation does not overlap the update, decided
from the config before any worker starts and printed at start; the graph and the engine follow
the decision (the sleep/wake/load order recorded by the fake ``vllm.LLM`` of
``test_vllm_call_order``)."""

from __future__ import annotations

import pytest
import torch
from test_graph_async import PROMPTS, _ctx, _deps
from test_vllm_call_order import SAMPLED, VERL_ORDER, _generator, _order, fake_vllm  # noqa: F401 - a fixture

from flowrl.config import ConfigError, load_config
from flowrl.config.free_cache_auto import describe_free_cache, resolve_free_cache
from flowrl.graphs.family import resolve_family
from flowrl.roles.specs import rollout_spec

VLLM = ["rollout.name=vllm", "actor.use_kl_loss=false"]


@pytest.mark.parametrize("args,expected,why", [
    ([], False, "rollout.name=hf has no engine memory to free"),
    (VLLM, True, "placement hybrid shares the trainer's devices"),
    ([*VLLM, "cluster.placement=colocated"], True, "placement colocated shares"),
    ([*VLLM, "cluster.placement=split"], False, "placement split gives the rollout devices of its own"),
    ([*VLLM, "cluster.placement=colocated", "trainer.staleness=1", "cluster.controller=worker"], False,
     "generation overlaps the update"),
    ([*VLLM, "rollout.free_cache_engine=false"], False, "set"),
    ([*VLLM, "cluster.placement=split", "rollout.free_cache_engine=true"], True, "set"),
])
def test_the_decision(args, expected, why):
    cfg = load_config(None, args)
    value, reason = resolve_free_cache(cfg)
    assert value is expected and why in reason
    line = describe_free_cache(cfg)
    assert line.startswith(f"rollout.free_cache_engine={expected}") and ("auto" in line) == (reason != "set")
    assert rollout_spec(cfg).role_kwargs.get("engine_kwargs", {}).get("free_cache_engine", expected) is expected


def test_explicit_values_are_checked_as_before():
    with pytest.raises(ConfigError, match="cannot sleep"):
        load_config(None, ["rollout.free_cache_engine=true"])  # hf
    with pytest.raises(ConfigError, match="overlaps generation"):
        load_config(None, [*VLLM, "cluster.placement=colocated", "trainer.staleness=1", "cluster.controller=worker",
                           "rollout.free_cache_engine=true"])
    with pytest.raises(ConfigError, match="true, false or auto"):
        load_config(None, ["rollout.free_cache_engine=sometimes"])


@pytest.mark.parametrize("placement,sleeps", [("colocated", True), ("split", False)])
def test_graph_and_engine_follow_auto(fake_vllm, placement, sleeps):  # noqa: F811 - the fixture
    cfg = load_config(None, [*VLLM, f"cluster.placement={placement}"])
    assert cfg.rollout.free_cache_engine == "auto"
    deps = _deps(*resolve_family(cfg)(cfg).build(_ctx(cfg), PROMPTS, step=0).outputs)
    assert ("rollout_sleep" in deps) is sleeps
    gen = _generator()
    gen.free_cache_engine = rollout_spec(cfg).role_kwargs["engine_kwargs"]["free_cache_engine"]
    gen.generate([[1, 2]], SAMPLED, seed=3)
    if "rollout_sleep" in deps:  # the graph's release node, then the reshard's load
        gen.sleep()
    gen.load_hf_state({"model.embed_tokens.weight": torch.zeros(4, 2)})
    gen.generate([[1, 2]], SAMPLED, seed=4)
    order = _order(gen.llm.calls)
    if sleeps:
        assert order == VERL_ORDER
    else:
        assert order == [("generate",), ("load",), ("generate",)]

"""The algorithm-family registry, without a cluster: the estimator's traits pick a built-in,
``algorithm.family`` names one (or a user's ``module:Class``), unknown names are refused with
the valid ones listed, and building a graph computes nothing (it only reserves call order)."""

import dataclasses
import sys
import textwrap

import pyarrow as pa
import pytest

from flowrl.actors import GroupMesh, WorkerGroup
from flowrl.config import load_config
from flowrl.graphs.family import BuildContext, Family, FamilyState, IterationGraph, family_names, resolve_family
from flowrl.graphs.grpo import GRPO
from flowrl.graphs.ppo import PPO
from flowrl.graphs.remax import ReMax

PROMPTS = pa.table({"group": pa.array([0], pa.int64())})


def _with_family(cfg, name):
    return dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, family=name))


class _NoCalls:
    """A rank actor that fails the test if anything calls it."""

    def call(self, seq, method, *args):
        raise AssertionError(f"building a graph called {method} (call {seq}) on a worker")

    def host_port(self):
        raise AssertionError("building a graph asked a worker for its address")


def _groups():
    def group(name, dp=1):
        return WorkerGroup(name, actors=[_NoCalls()] * dp, addresses=[""] * dp, mesh=GroupMesh(dp=dp))

    return {name: group(name) for name in ("rollout", "actor", "ref", "critic", "rm")}


@pytest.mark.parametrize("estimator, family", [
    ("grpo", GRPO), ("rloo", GRPO), ("reinforce_plus_plus", GRPO), ("gae", PPO), ("remax", ReMax),
])
def test_the_estimator_picks_the_builtin_family(estimator, family):
    assert resolve_family(load_config(None, [f"algorithm.adv_estimator={estimator}"])) is family
    assert {"grpo", "ppo", "remax"} <= set(family_names())


def test_algorithm_family_names_a_registered_family():
    cfg = _with_family(load_config(None, ["algorithm.adv_estimator=gae"]), "ppo")
    assert resolve_family(cfg) is PPO
    assert PPO.checkpointed_groups == ("critic",) and GRPO.checkpointed_groups == ()


def test_a_user_family_by_import_string(tmp_path, monkeypatch):
    (tmp_path / "my_families.py").write_text(textwrap.dedent("""
        from flowrl.graphs.family import Family, IterationGraph

        class OneNode(Family):
            def group_specs(self):
                return []

            def build(self, ctx, prompts, *, step, collected=None):
                return IterationGraph(result=None, sync=None)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_families", raising=False)
    cls = resolve_family(_with_family(load_config(), "my_families:OneNode"))
    assert cls.__name__ == "OneNode" and issubclass(cls, Family)
    family = cls(load_config())
    assert isinstance(family.state, FamilyState) and family.state.state_dict() == {}
    assert family.collect(None, PROMPTS, step=0, compute=None, dataset=None) is None  # no driver hook


def test_an_unknown_family_is_refused_with_the_valid_names():
    with pytest.raises(ValueError, match="unknown algorithm family 'nope'; valid: dpo, grpo, ppo, remax, rm, sft"):
        resolve_family(_with_family(load_config(), "nope"))
    with pytest.raises(ValueError, match="the ppo family trains a critic"):
        PPO(load_config())  # grpo's estimator reads no values


@pytest.mark.parametrize("overrides", [
    [],
    ["algorithm.adv_estimator=gae", "actor.use_kl_loss=false"],
    ["algorithm.adv_estimator=remax", "algorithm.use_kl_in_reward=true", "actor.use_kl_loss=false"],
    ["reward_model.enable=true", "reward_model.model_path=/rm", "reward_model.overlong_buffer.enable=true",
     "reward_model.overlong_buffer.len=2", "rollout.name=vllm", "rollout.free_cache_engine=true"],
])
def test_building_a_graph_computes_nothing(overrides):
    cfg = load_config(None, overrides)
    family = resolve_family(cfg)(cfg)
    before = family.state.state_dict()
    graph = family.build(BuildContext(cfg, _groups(), "/no/tokenizer"), PROMPTS, step=0)
    assert isinstance(graph, IterationGraph) and graph.dependencies()  # built, never run
    assert family.state.state_dict() == before


def test_kl_in_reward_state_round_trips_in_the_checkpoint_format():
    cfg = load_config(None, ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.1", "actor.use_kl_loss=false"])
    family = resolve_family(cfg)(cfg)
    assert family.state.state_dict()["kl_ctrl"]["value"] == pytest.approx(0.1)
    family.state.load_state_dict({"kl_ctrl": {"value": 0.25}})
    assert family.state.kl_coef == 0.25
    family.state.reset()
    assert family.state.kl_coef == pytest.approx(0.1)


def test_dynamic_sampling_is_the_collect_hook_and_build_starts_from_its_samples():
    from flowrl.metrics import names
    from flowrl.nodes import NodeOut

    cfg = load_config(None, ["algorithm.filter_groups.enable=true", "data.train_batch_size=2", "rollout.n=2",
                             "actor.ppo_mini_batch_size=2", "actor.use_kl_loss=false"])
    family = resolve_family(cfg)(cfg)
    ctx = BuildContext(cfg, _groups(), "/x")
    kept = pa.table({"group": pa.array([0, 0, 1, 1], pa.int64())})
    computed = []

    def compute(out):  # the run computes each round's graph; here: both groups kept at once
        computed.append(out.key)
        return NodeOut(kept, {names.KEPT_GROUPS: 2.0, names.GROUPS: 2.0, "timing_s/gen": 1.0})

    collected = family.collect(ctx, PROMPTS, step=5, compute=compute, dataset=None)
    assert computed == ["filter_groups-000005"]  # one round was enough
    assert collected.value.num_rows == 4 and collected.metrics[names.NUM_GEN_BATCHES] == 1.0
    assert collected.metrics["timing_s/gen"] == 1.0 and names.KEPT_GROUPS not in collected.metrics
    graph = family.build(ctx, PROMPTS, step=5, collected=collected)
    deps = {k.rsplit("-", 1)[0]: {d.rsplit("-", 1)[0] for d in v} for k, v in graph.dependencies().items()}
    assert "gen" not in deps and deps["adv"] == set()  # the graph starts from the kept samples

"""The GRPO iteration graph's shape, without a cluster: nodes, dependencies, rendering."""

import shutil

import pyarrow as pa
import pytest

from flowrl.actors import GroupMesh, WorkerGroup
from flowrl.config import load_config
from flowrl.graphs.family import BuildContext
from flowrl.graphs.grpo import GRPO


def _groups():
    def group(name, dp):
        return WorkerGroup(name, actors=[None] * dp, addresses=[""] * dp, mesh=GroupMesh(dp=dp))

    return {"rollout": group("rollout", 2), "actor": group("actor", 2), "ref": group("ref", 1)}


def build_iteration(cfg, groups, prompts, *, step, tokenizer_dir):
    return GRPO(cfg).build(BuildContext(cfg, groups, tokenizer_dir), prompts, step=step)


def _deps(graph):
    def name(key):
        return key.rsplit("-", 1)[0]

    return {name(k): {name(d) for d in deps} for k, deps in graph.dependencies().items()}


PROMPTS = pa.table({"group": pa.array([0], pa.int64())})


def test_graph_nodes_and_dependencies():
    cfg = load_config(None, ["actor.ppo_mini_batch_size=16"])  # two optimizer steps -> old_log_prob node
    deps = _deps(build_iteration(cfg, _groups(), PROMPTS, step=3, tokenizer_dir="/x"))
    assert set(deps) == {"gen", "reward", "ref", "old_log_prob", "adv", "update_actor", "reshard", "collect"}
    assert deps["reward"] == {"gen"}
    assert deps["ref"] == {"reward"} and deps["old_log_prob"] == {"reward"}  # parallel branches
    assert deps["adv"] == {"reward", "ref", "old_log_prob"}
    assert deps["update_actor"] == {"adv"}
    assert deps["reshard"] == {"update_actor"}
    # the result does not wait for the reshard: the rollout group's call order protects the next gen
    assert deps["collect"] == {"adv", "update_actor"}


def test_on_policy_graph_skips_old_logprobs_and_kl_free_skips_ref():
    cfg = load_config(None, ["actor.use_kl_loss=false"])
    groups = _groups()
    del groups["ref"]
    deps = _deps(build_iteration(cfg, groups, PROMPTS, step=0, tokenizer_dir="/x"))
    assert "ref" not in deps and "old_log_prob" not in deps
    assert deps["adv"] == {"reward"}


def test_calls_to_one_group_are_numbered_in_build_order():
    cfg = load_config(None, ["actor.ppo_mini_batch_size=16"])
    groups = _groups()
    build_iteration(cfg, groups, PROMPTS, step=0, tokenizer_dir="/x")
    # actor: old_log_prob (1), update (2), reshard (3); the next call gets 4
    assert groups["actor"].reserve() == 4
    assert groups["rollout"].reserve() == 3  # generate (1), reshard (2)


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot binary is not installed")
def test_graph_renders(tmp_path):
    pytest.importorskip("graphviz")
    cfg = load_config()
    graph = build_iteration(cfg, _groups(), PROMPTS, step=0, tokenizer_dir="/x")
    graph.visualize(filename=str(tmp_path / "grpo.png"))
    assert (tmp_path / "grpo.png").stat().st_size > 1000

"""An iteration's graph stays O(nodes) at any world size: the GRPO family's graph, built with fake
worker groups (no cluster, nothing computed), has the same Dask tasks at 8 and at 1,024 simulated
ranks per group. A node calls all ranks of a group from inside one task (``BoundCall``), so the
graph never fans out per rank."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flowrl.actors import GroupMesh, WorkerGroup
from flowrl.config import load_config
from flowrl.graphs.family import BuildContext, resolve_family
from flowrl.graphs.grpo import GRPO

PROMPTS = pa.table({"group": pa.array([0], pa.int64())})


class _NoCalls:
    """A rank actor that fails the test if building the graph calls it."""

    def call(self, seq, method, *args):
        raise AssertionError(f"building a graph called {method} (call {seq}) on a worker")

    def host_port(self):
        raise AssertionError("building a graph asked a worker for its address")


def _groups(meshes: dict[str, GroupMesh]) -> dict[str, WorkerGroup]:
    def group(name: str, mesh: GroupMesh) -> WorkerGroup:
        n = mesh.world_size
        return WorkerGroup(name, actors=[_NoCalls()] * n, addresses=[""] * n, mesh=mesh)

    one = {name: GroupMesh() for name in ("critic", "rm")}
    return {name: group(name, mesh) for name, mesh in {**one, **meshes}.items()}


SMALL = {"rollout": GroupMesh(dp=8), "actor": GroupMesh(tp=4, pp=2), "ref": GroupMesh(dp=8)}
# 1,024 ranks in every group: TP8 x PP16 x DP8 training, TP4 x DP256 generation
LARGE = {"rollout": GroupMesh(dp=256, tp=4), "actor": GroupMesh(dp=8, tp=8, pp=16),
         "ref": GroupMesh(dp=128, tp=8)}


def _tasks(overrides: list[str], meshes: dict[str, GroupMesh]) -> dict[str, set[str]]:
    cfg = load_config(None, overrides)
    family = resolve_family(cfg)(cfg)
    assert isinstance(family, GRPO)
    graph = family.build(BuildContext(cfg, _groups(meshes), "/no/tokenizer"), PROMPTS, step=0)
    return graph.dependencies()


def _names(tasks: dict[str, set[str]]) -> list[str]:
    """Task keys without their tokens: ``"gen-1f3a..."`` -> ``"gen"``."""
    return sorted(key.rsplit("-", 1)[0] for key in tasks)


@pytest.mark.parametrize("overrides", [
    [], ["algorithm.adv_estimator=rloo", "actor.use_kl_loss=false"]])
def test_grpo_graph_has_the_same_tasks_at_8_and_1024_ranks(overrides):
    small, large = _tasks(overrides, SMALL), _tasks(overrides, LARGE)
    assert sum(m.world_size for m in LARGE.values()) == 3 * 1024
    assert len(large) == len(small)
    assert _names(large) == _names(small)  # the same nodes, one task each
    assert len(set(_names(large))) == len(large)
    # and the same shape: each node depends on the same nodes
    shape = {tuple(sorted(_names({d: set() for d in deps}))) for deps in small.values()}
    assert shape == {tuple(sorted(_names({d: set() for d in deps}))) for deps in large.values()}
    assert {"gen", "reward", "adv", "update_actor", "reshard"} <= set(_names(large))

"""``cluster.placement=hybrid``: its config checks (before any worker starts), its pool, the fused
group spec and the views the families call (pure: no cluster, no torch model)."""

import itertools

import pytest

from flowrl.actors import GroupMesh
from flowrl.actors.group import WorkerGroup
from flowrl.actors.rank import _resolve
from flowrl.actors.session import GroupSpec
from flowrl.cluster.pools import rank_threads
from flowrl.config import ClusterConfig, ConfigError, SlurmConfig, load_config
from flowrl.config.pools import COLOCATED_POOL, HYBRID_GROUP, Pool, resolve_pools
from flowrl.roles.specs import hybrid_specs
from flowrl.run.topology import add_views


def _error(overrides):
    with pytest.raises(ConfigError) as exc:
        load_config(None, ["cluster.placement=hybrid", *overrides])
    return str(exc.value)


def test_hybrid_is_accepted_with_the_defaults():
    assert load_config(None, ["cluster.placement=hybrid"]).cluster.placement == "hybrid"


@pytest.mark.parametrize("overrides, key, fix", [
    (["trainer.staleness=1"], "trainer.staleness=1", "cluster.placement=split"),
    (["trainer.async_mode=stream"], "trainer.async_mode='stream'", "cluster.placement=split"),
    (["rollout.data_parallel_size=1"], "rollout.data_parallel_size=1", "set rollout ranks to 2"),
    (["ref.data_parallel_size=1"], "ref.data_parallel_size=1", "set ref ranks to 2"),
    (["actor.strategy=megatron", "actor.data_parallel_size=1", "actor.tensor_model_parallel_size=2"],
     "actor.strategy='megatron'", "cluster.placement=colocated"),
    (["rollout.name=vllm"], "rollout.name='vllm'", "rollout.free_cache_engine=true"),
    (["cluster.pools=[{name: a, groups: [actor, rollout, ref]}]"], "cluster.pools", "leave cluster.pools empty"),
])
def test_refused_settings_name_the_key_and_the_fix(overrides, key, fix):
    message = _error(overrides)
    assert message.startswith(key) and "; fix: " in message and fix in message.split("; fix: ")[1]


def test_the_hybrid_pool_counts_each_fused_rank_once():
    cluster = ClusterConfig(placement="hybrid")
    # rollout, actor and ref share 2 processes; the critic gets 1 of its own in the same pool
    assert resolve_pools(cluster, {"rollout": 2, "actor": 2, "ref": 2, "critic": 1}) == [
        Pool(COLOCATED_POOL, 3, ("rollout", "actor", "ref", "critic"))]
    assert resolve_pools(cluster, {HYBRID_GROUP: 2, "critic": 1})[0].workers == 3  # the fused specs
    assert resolve_pools(ClusterConfig(), {"rollout": 2, "actor": 2, "ref": 2})[0].workers == 6  # colocated


def test_hybrid_specs_fuse_rollout_actor_ref_and_leave_the_rest():
    specs = [GroupSpec("rollout", "r:R", {"a": 1}, GroupMesh(dp=4)), GroupSpec("actor", "p:P", {"b": 2}, GroupMesh(dp=2, tp=2)),
             GroupSpec("ref", "f:F", {}, GroupMesh(dp=4)), GroupSpec("critic", "c:C", {}, GroupMesh(dp=1))]
    started, views = hybrid_specs(specs, num_threads=3)
    assert [s.name for s in started] == [HYBRID_GROUP, "critic"]
    fused = started[0]
    assert fused.role_cls == "flowrl.roles.hybrid:HybridRole" and fused.mesh == GroupMesh(dp=2, tp=2)
    assert fused.role_kwargs == {"parts": {"rollout": ("r:R", {"a": 1}), "actor": ("p:P", {"b": 2}), "ref": ("f:F", {})},
                                 "num_threads": 3}
    assert views == {"rollout": ("rollout", GroupMesh(dp=4)), "actor": ("actor", GroupMesh(dp=2, tp=2)),
                     "ref": ("ref", GroupMesh(dp=4))}
    assert hybrid_specs(specs[2:])[0] == specs[2:]  # no actor + rollout pair: nothing fused


def test_views_share_the_ranks_and_the_call_order():
    group = WorkerGroup(HYBRID_GROUP, ["a0", "a1"], ["w0", "w1"], GroupMesh(dp=1, tp=2))
    groups = add_views({HYBRID_GROUP: group}, {"rollout": ("rollout", GroupMesh(dp=2)), "actor": ("actor", None)})
    rollout, actor = groups["rollout"], groups["actor"]
    assert rollout.actors is group.actors and rollout.mesh == GroupMesh(dp=2) and actor.mesh == group.mesh
    assert [rollout.reserve(), actor.reserve(), group.reserve(), rollout.reserve()] == [1, 2, 3, 4]  # one counter
    assert rollout.method("generate") == "rollout.generate" and group.method("generate") == "generate"
    assert rollout.method("_teardown") == "_teardown"  # the rank actor's built-ins stay the actor's
    with pytest.raises(ValueError, match="3 ranks"):
        group.view("x", "x", GroupMesh(dp=3))
    assert isinstance(group._counter, itertools.count)


def test_a_dotted_method_walks_the_role_parts():
    class Part:
        def generate(self):
            return "gen"

    class Role:
        rollout = Part()

        def reshard(self):
            return "sync"

    assert _resolve(Role(), "rollout.generate")() == "gen" and _resolve(Role(), "reshard")() == "sync"


def test_rank_threads_split_the_cores_between_rank_processes():
    assert rank_threads(ClusterConfig(kind="slurm", slurm=SlurmConfig(cores=8, processes=2)), 6) == 4
    assert rank_threads(ClusterConfig(), 10**6) == 1
    assert rank_threads(ClusterConfig(), 1) >= 1

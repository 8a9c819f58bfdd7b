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


def test_vllm_joins_the_trainers_processes_and_auto_chooses_hybrid_for_it():
    """vLLM's spec ``joins_trainer_group`` (its external launcher): hybrid is accepted, tp 2 too,
    and ``auto`` chooses it (the 3D-HybridEngine, issue 29); a backend with an engine of its own
    that cannot join the trainer's group is still refused (``test_backend_spec``)."""
    assert load_config(None, ["cluster.placement=hybrid", "rollout.name=vllm"]).placement == "hybrid"
    tp2 = ["rollout.name=vllm", "rollout.data_parallel_size=1", "rollout.tensor_model_parallel_size=2"]
    assert load_config(None, ["cluster.placement=hybrid", *tp2]).placement == "hybrid"
    assert _auto(["rollout.name=vllm"])[1:] == ("hybrid", "auto")
    assert _auto(tp2)[1:] == ("hybrid", "auto")


@pytest.mark.parametrize("overrides, key, fix", [
    (["trainer.staleness=1"], "trainer.staleness=1", "cluster.placement=split"),
    (["trainer.async_mode=stream"], "trainer.async_mode='stream'", "cluster.placement=split"),
    (["rollout.data_parallel_size=1"], "rollout.data_parallel_size=1", "set rollout ranks to 2"),
    (["ref.data_parallel_size=1"], "ref.data_parallel_size=1", "set ref ranks to 2"),
    (["actor.strategy=megatron", "actor.data_parallel_size=1", "actor.tensor_model_parallel_size=2"],
     "actor.strategy='megatron'", "cluster.placement=colocated"),
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


# -- cluster.placement=auto (the default): hybrid where the config allows it, else colocated ---------------------

def _auto(overrides=()):
    cfg = load_config(None, list(overrides))
    return cfg.cluster.placement, cfg.placement, cfg.placement_reason


def test_the_default_is_auto_and_resolves_to_hybrid():
    from flowrl.run.topology import describe_placement

    assert _auto() == ("auto", "hybrid", "auto")
    assert describe_placement(load_config(None, [])) == "placement: hybrid (auto)"
    # the groups that make hybrid possible without a reference, and with a critic of its own
    assert _auto(["actor.use_kl_loss=false"])[1:] == ("hybrid", "auto")
    assert _auto(["algorithm.adv_estimator=gae"])[1:] == ("hybrid", "auto")


@pytest.mark.parametrize("overrides, reason", [
    (["trainer.staleness=1"], "trainer.staleness=1 generates while the trainer trains"),
    (["trainer.staleness=1", "trainer.async_mode=stream"], "trainer.async_mode=stream generates while the trainer trains"),
    (["rollout.data_parallel_size=1"], "the rollout group has 1 ranks, the actor 2"),
    (["ref.data_parallel_size=1"], "the ref group has 1 ranks, the actor 2"),
    (["actor.strategy=megatron", "actor.data_parallel_size=1", "actor.tensor_model_parallel_size=2"],
     "actor.strategy=megatron cannot share its process with a reference"),
    (["cluster.pools=[{name: a, groups: [actor, rollout, ref]}]"], "cluster.pools are declared"),
])
def test_auto_falls_back_to_colocated_naming_what_hybrid_cannot_do(overrides, reason):
    # each of these is refused by an explicit cluster.placement=hybrid (above); auto never refuses
    requested, placement, why = _auto(overrides)
    assert (requested, placement) == ("auto", "colocated")
    assert why.startswith("auto: ") and reason in why.split("auto: ", 1)[1].split("; ")


def test_auto_names_every_reason_and_explicit_placements_stay_as_given():
    _, placement, why = _auto(["trainer.staleness=1", "rollout.data_parallel_size=1"])
    assert placement == "colocated"
    assert why == ("auto: the rollout group has 1 ranks, the actor 2; "
                   "trainer.staleness=1 generates while the trainer trains")
    # LoRA into vLLM runs in the trainer's processes too: each installs the adapters in its engine
    assert _auto(["rollout.name=vllm", "model.lora_rank=8"])[1:] == ("hybrid", "auto")
    for explicit in ("colocated", "split", "hybrid"):
        assert _auto([f"cluster.placement={explicit}"]) == (explicit, explicit, "")
    assert _auto(["cluster.placement=colocated", "trainer.staleness=1"])[1:] == ("colocated", "")


def test_auto_is_resolved_on_each_config_not_kept_from_an_earlier_one():
    import dataclasses

    cfg = load_config(None, [])
    assert cfg.placement == "hybrid"
    ahead = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, staleness=1))  # no error: still auto
    assert (ahead.cluster.placement, ahead.placement) == ("auto", "colocated")


def test_the_run_directory_records_the_resolved_placement_and_why(tmp_path):
    import yaml

    from flowrl.run.driver import _dump_resolved_config

    for overrides, first_line, written in (([], "# placement: hybrid (auto)", "hybrid"),
                                           (["trainer.staleness=1"],
                                            "# placement: colocated (auto: trainer.staleness=1 generates while the "
                                            "trainer trains)", "colocated"),
                                           (["cluster.placement=split"], "# placement: split", "split")):
        path = tmp_path / "config.yaml"
        _dump_resolved_config(load_config(None, overrides), path)
        text = path.read_text()
        assert text.splitlines()[0] == first_line
        assert yaml.safe_load(text)["cluster"]["placement"] == written
        assert load_config(path).placement == written  # the saved config loads and starts the same placement


def test_the_session_gets_the_resolved_placement(monkeypatch, tmp_path):
    """``start_groups`` with auto: the rollout, actor and ref specs fused into one group of 2 ranks
    on 2 workers (hybrid), and ``Session.start`` given the resolved cluster, never ``auto``."""
    import flowrl.run.topology as topology
    from flowrl.roles.specs import actor_spec, ref_spec, rollout_spec

    seen = {}

    class FakeSession:
        @classmethod
        def start(cls, num_workers, *, cluster, group_sizes, **_):
            seen.update(num_workers=num_workers, placement=cluster.placement, group_sizes=group_sizes)
            raise RuntimeError("stop here")

        def close(self):
            pass

    monkeypatch.setattr(topology, "Session", FakeSession)
    for overrides, expected in (([], (2, "hybrid", {HYBRID_GROUP: 2})),
                                (["trainer.staleness=1"], (6, "colocated", {"rollout": 2, "actor": 2, "ref": 2}))):
        cfg = load_config(None, overrides)
        with pytest.raises(RuntimeError, match="stop here"):
            topology.start_groups(cfg, [rollout_spec(cfg), actor_spec(cfg), ref_spec(cfg)], tmp_path)
        assert (seen["num_workers"], seen["placement"], seen["group_sizes"]) == expected

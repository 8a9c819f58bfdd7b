"""The device plan (flowrl.parallel.device_plan, flowrl.config.devices): every rank's node, GPUs,
local rank, backend and dtype over fake inventories; pure, no GPU."""

from __future__ import annotations

import pytest

from flowrl.config import ConfigError, load_config
from flowrl.config.devices import device_plan, group_layouts, slurm_inventory
from flowrl.config.pools import HYBRID_GROUP
from flowrl.parallel.device_plan import (CPU_BACKEND, GPU_BACKEND, DevicePlanError, GroupLayout, Inventory,
                                         plan_devices)


def _sizes(n: int, **extra: str) -> list[str]:
    return [f"actor.data_parallel_size={n}", f"rollout.data_parallel_size={n}", f"ref.data_parallel_size={n}",
            *(f"{k}={v}" for k, v in extra.items())]


def _gpu_sets(plan, group: str) -> list[tuple[int, tuple[int, ...]]]:
    return [(r.node, r.gpus) for r in plan.group(group)]


def _trainer(plan) -> str:
    """The group holding the actor's ranks: the fused hybrid group, or ``actor``."""
    return HYBRID_GROUP if plan.group(HYBRID_GROUP) else "actor"


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_one_node_every_rank_its_own_gpu_shared_by_colocated_roles(gpus):
    plan = device_plan(load_config(None, _sizes(gpus, **{"cluster.placement": "colocated"})),
                       Inventory(gpus_per_node=gpus))
    for group in ("actor", "rollout", "ref"):
        # rank r of every colocated group on GPU r: distinct within a group, shared across groups
        assert _gpu_sets(plan, group) == [(0, (r,)) for r in range(gpus)]
        assert {r.backend for r in plan.group(group)} == {GPU_BACKEND}
    assert [r.local_rank for r in plan.group("actor")] == list(range(gpus))
    assert plan.of("actor", gpus - 1).environment() == {"LOCAL_RANK": str(gpus - 1), "CUDA_VISIBLE_DEVICES": str(gpus - 1)}
    assert plan.of("actor", 0).device == "cuda:0"


def test_bf16_on_gpu_fp32_on_cpu_unless_named():
    layouts = [GroupLayout(name="actor", world_size=2, pool="p", size_key="actor.data_parallel_size", size_value=2)]
    assert {r.dtype for r in plan_devices(Inventory(gpus_per_node=2), layouts).ranks} == {"bfloat16"}
    assert {r.dtype for r in plan_devices(Inventory(gpus_per_node=0), layouts).ranks} == {"float32"}
    assert {r.dtype for r in plan_devices(Inventory(gpus_per_node=2), layouts, dtype="float32").ranks} == {"float32"}


def test_cpu_plan_is_gloo_without_devices():
    plan = device_plan(load_config(None, []), Inventory(gpus_per_node=0))
    assert {r.backend for r in plan.ranks} == {CPU_BACKEND}
    assert all(r.gpus == () and r.device == "cpu" and "CUDA_VISIBLE_DEVICES" not in r.environment() for r in plan.ranks)
    assert plan.gpus_used() == set()


def test_split_pools_take_disjoint_gpus():
    plan = device_plan(load_config(None, _sizes(2, **{"cluster.placement": "split"})), Inventory(gpus_per_node=8))
    # pools in the order the run starts them, actor first: actor 0-1, rollout 2-3, ref 4-5
    assert _gpu_sets(plan, "actor") == [(0, (0,)), (0, (1,))]
    assert _gpu_sets(plan, "rollout") == [(0, (2,)), (0, (3,))]
    assert _gpu_sets(plan, "ref") == [(0, (4,)), (0, (5,))]
    used = [g for r in plan.ranks for g in r.gpus]
    assert len(used) == len(set(used)) == 6


def test_hybrid_and_colocated_share_the_same_gpus():
    colocated = device_plan(load_config(None, _sizes(4, **{"cluster.placement": "colocated"})),
                            Inventory(gpus_per_node=4))
    assert colocated.gpus_used() == {(0, g) for g in range(4)}
    assert _gpu_sets(colocated, "actor") == _gpu_sets(colocated, "rollout") == _gpu_sets(colocated, "ref")
    # hybrid: the plan names the one fused group the session starts (one process per rank), same GPUs
    hybrid = device_plan(load_config(None, _sizes(4, **{"cluster.placement": "hybrid"})), Inventory(gpus_per_node=4))
    assert {r.group for r in hybrid.ranks} == {HYBRID_GROUP}
    assert _gpu_sets(hybrid, HYBRID_GROUP) == _gpu_sets(colocated, "actor")


@pytest.mark.parametrize("placement", ["hybrid", "colocated", "split"])
def test_the_plan_names_the_groups_the_session_starts(placement):
    """The layouts' names and sizes are the specs ``start_groups`` creates, after hybrid fusion."""
    from flowrl.roles.specs import actor_spec, ref_spec, rollout_spec
    from flowrl.run.topology import started_specs

    cfg = load_config(None, _sizes(2, **{"cluster.placement": placement}))
    specs, _ = started_specs(cfg, [rollout_spec(cfg), actor_spec(cfg), ref_spec(cfg)])
    assert sorted((g.name, g.world_size) for g in group_layouts(cfg)) == sorted((s.name, s.mesh.world_size) for s in specs)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_vllm_replica_of_tp_t_gets_t_gpus(tp):
    over = ["rollout.name=vllm", f"rollout.tensor_model_parallel_size={tp}", f"rollout.data_parallel_size={8 // tp}",
            "actor.data_parallel_size=8", "ref.data_parallel_size=8"]
    # hybrid (auto's choice for vLLM since its external launcher): the engine is a rank of the
    # trainer's group, tp ranks of one GPU each form a replica
    hybrid = device_plan(load_config(None, over), Inventory(gpus_per_node=8))
    assert [r.gpus for r in hybrid.ranks] == [(g,) for g in range(8)]
    # colocated: vLLM's engine runs in processes of its own and spans its replica's t GPUs
    plan = device_plan(load_config(None, over + ["cluster.placement=colocated"]), Inventory(gpus_per_node=8))
    engines = [r for r in plan.group("rollout") if r.rank % tp == 0]
    assert [r.gpus for r in engines] == [tuple(range(k * tp, (k + 1) * tp)) for k in range(8 // tp)]
    # the replica's other ranks stage tensors on their own GPU, inside the replica's set
    for r in plan.group("rollout"):
        if r.rank % tp:
            assert r.gpus == (r.rank,) and r.rank in engines[r.rank // tp].gpus


def test_two_nodes_of_eight_on_slurm():
    cfg = load_config(None, _sizes(16, **{"cluster.kind": "slurm", "cluster.slurm.gpus_per_job": 8,
                                          "cluster.slurm.processes": 8, "cluster.slurm.cores": 16}))
    inv = slurm_inventory(cfg)
    assert (inv.nodes, inv.gpus_per_node) == (2, 8)
    plan = device_plan(cfg, inv)
    assert _gpu_sets(plan, _trainer(plan)) == [(r // 8, (r % 8,)) for r in range(16)]
    assert [r.local_rank for r in plan.group(_trainer(plan))] == [r % 8 for r in range(16)]
    assert [plan.pool_node(r) for r in plan.group(_trainer(plan))] == [r // 8 for r in range(16)]
    assert len(plan.gpus_used()) == 16


def test_more_ranks_than_gpus_is_refused_naming_the_key_and_the_fix():
    with pytest.raises(ConfigError) as err:
        device_plan(load_config(None, _sizes(2)), Inventory(gpus_per_node=1))
    assert err.value.key == "actor.data_parallel_size" and err.value.value == 2
    assert "set actor.data_parallel_size to at most 1" in str(err.value)
    with pytest.raises(ConfigError, match="ref.data_parallel_size"):  # split: 2 + 2 + 2 > 4
        device_plan(load_config(None, _sizes(2, **{"cluster.placement": "split"})), Inventory(gpus_per_node=4))


def test_a_replica_never_straddles_nodes():
    layouts = [GroupLayout(name="actor", world_size=2, pool="a", size_key="actor.data_parallel_size", size_value=2),
               GroupLayout(name="rollout", world_size=4, pool="b", size_key="rollout.data_parallel_size",
                           size_value=1, engine_span=4)]
    with pytest.raises(DevicePlanError, match="nodes 0 and 1"):  # the rollout pool starts at slot 2 of 4
        plan_devices(Inventory(nodes=2, gpus_per_node=4), layouts)
    with pytest.raises(DevicePlanError, match="more than a node's 2"):
        plan_devices(Inventory(nodes=4, gpus_per_node=2), layouts[1:])


def test_flowrl_devices_prints_the_plan_and_refuses_with_exit_2(capsys):
    from flowrl.cli import main

    assert main(["devices", *_sizes(8), "--gpus-per-node", "8"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith(f"{HYBRID_GROUP} ")]  # auto: hybrid
    assert [r[3] for r in rows] == [str(g) for g in range(8)] and {r[5] for r in rows} == {GPU_BACKEND}
    assert main(["devices", "actor.data_parallel_size=2", "--gpus-per-node", "1"]) == 2
    assert "error: actor.data_parallel_size=2" in capsys.readouterr().err

"""Split pools on SLURM with jobs of their own size (``cluster.pools[].gpus_per_job``): each pool's
jobs get their own ``--gres`` and one worker process per GPU and group, and the device plan puts
each pool on its own jobs (pure: no SLURM, no GPU)."""

import pytest

from flowrl.cluster.job_script import gres_directive, pool_jobs
from flowrl.config import ConfigError, load_config
from flowrl.config.devices import check_slurm_jobs, device_plan, slurm_inventory
from flowrl.config.pools import resolve_pools

POOLS = "cluster.pools=[{name: rollout, groups: [rollout], gpus_per_job: 4}, {name: trainer, groups: [actor, ref], gpus_per_job: 8}]"


def _cfg(*extra):
    return load_config(None, ["cluster.kind=slurm", "cluster.slurm.cores=32", POOLS, "rollout.data_parallel_size=4",
                              "ref.data_parallel_size=8", *extra])


def test_each_pool_is_planned_on_its_own_jobs():
    cfg = _cfg("actor.data_parallel_size=8")
    plan = device_plan(cfg, slurm_inventory(cfg))
    check_slurm_jobs(cfg, plan)  # the jobs hold the plan
    # the trainer pool first (its groups lead): one 8-GPU job, node 0, actor and ref rank r on GPU r;
    # the rollout pool: one 4-GPU job, node 1, GPUs 0..3
    assert [(r.node, r.gpus) for r in plan.group("actor")] == [(0, (g,)) for g in range(8)]
    assert [(r.node, r.gpus) for r in plan.group("ref")] == [(0, (g,)) for g in range(8)]
    assert [(r.node, r.gpus, r.local_rank) for r in plan.group("rollout")] == [(1, (g,), g) for g in range(4)]
    assert {r.backend for r in plan.ranks} == {"cpu:gloo,cuda:nccl"}
    assert plan.inventory.total_gpus == 12 and len(plan.gpus_used()) == 12
    assert "trainer: 1 job(s) x 8 GPU(s), rollout: 1 job(s) x 4 GPU(s)" in plan.inventory.describe()
    assert [r.group for r in plan.ranks][:8] == ["actor"] * 8  # the groups' order, as before


def test_a_pool_larger_than_its_job_takes_more_jobs():
    cfg = _cfg("actor.data_parallel_size=16", "ref.data_parallel_size=16")
    plan = device_plan(cfg, slurm_inventory(cfg))
    check_slurm_jobs(cfg, plan)
    assert sorted({r.node for r in plan.group("actor")}) == [0, 1]  # 16 ranks on two 8-GPU jobs
    assert {r.node for r in plan.group("rollout")} == {2}
    assert plan.pool_node(plan.of("actor", 9)) == 1 and plan.pool_node(plan.of("rollout", 0)) == 0


def test_each_pools_job_script_has_its_own_gres_and_processes():
    cfg = _cfg("actor.data_parallel_size=16", "ref.data_parallel_size=16")
    pools = resolve_pools(cfg.cluster, cfg.worker_group_sizes)
    jobs = {what: (count, o) for what, count, o in pool_jobs(cfg.cluster, {"job_extra_directives": []}, pools,
                                                             controller=False)}
    # rollout: 4 workers, 4 per job (one per GPU) -> 1 job of gpu:4; trainer: 32 workers, 16 per job
    # (a GPU's actor rank and ref rank) -> 2 jobs of gpu:8
    assert jobs["rollout"] == (1, {"job_extra_directives": ["--gres=gpu:4"], "processes": 4})
    assert jobs["trainer"] == (2, {"job_extra_directives": ["--gres=gpu:8"], "processes": 16})


def test_a_typed_gres_keeps_its_type_per_pool():
    cfg = load_config(None, ["cluster.kind=slurm", "cluster.slurm.gres=gpu:a100:8"]).cluster
    assert gres_directive(cfg) == ["--gres=gpu:a100:8"]
    assert gres_directive(cfg, 4) == ["--gres=gpu:a100:4"] and gres_directive(cfg, 0) == []


def test_pool_gres_refusals_name_the_key_and_the_fix():
    with pytest.raises(ConfigError, match=r"pools\[0\]\.gpus_per_job=4.*cluster\.kind=local.*set cluster\.kind=slurm"):
        load_config(None, [POOLS])
    with pytest.raises(ConfigError, match=r"pools\[1\]\.gpus_per_job=8.*16 worker process.*cores=8.*at least 16"):
        load_config(None, ["cluster.kind=slurm", "cluster.slurm.cores=8", POOLS])
    with pytest.raises(ConfigError, match=r"gpus_per_job.*integer >= 0"):
        load_config(None, ["cluster.kind=slurm", "cluster.pools=[{name: p, groups: [actor], gpus_per_job: -1}]"])


def test_without_pool_gres_the_plan_is_the_one_of_before():
    cfg = load_config(None, ["cluster.kind=slurm", "cluster.slurm.gpus_per_job=8", "cluster.slurm.processes=8",
                             "cluster.slurm.cores=8", "cluster.placement=colocated", "actor.data_parallel_size=8",
                             "rollout.data_parallel_size=8", "ref.data_parallel_size=8"])
    plan = device_plan(cfg, slurm_inventory(cfg))
    assert type(plan.inventory).__name__ == "Inventory" and plan.inventory.total_gpus == 8

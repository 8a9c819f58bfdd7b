"""Workers placed by the device plan (issue 28 item 2), with fakes for everything a GPU would
answer: the inventory the driver sees (CUDA_VISIBLE_DEVICES, an ``nvidia-smi -L`` runner,
FLOWRL_DEVICES), the specs as the plan rewrites them, the refusal before any worker starts, the
worker chosen on the plan's node, and a rank's set-up order with a fake torch.distributed."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest

from flowrl.actors import GroupMesh
from flowrl.actors.device import NODE_DEVICES_ENV, apply_placement
from flowrl.actors.session import GroupSpec
from flowrl.cluster.inventory import DEVICES_ENV, local_inventory, parse_devices, run_inventory, visible_gpu_count
from flowrl.cluster.pools import choose_workers, worker_nodes
from flowrl.config import ConfigError, load_config
from flowrl.config.pools import HYBRID_GROUP
from flowrl.parallel.device_plan import CPU_BACKEND, GPU_BACKEND, Inventory
from flowrl.run.placement import GPU_DEVICE, place_specs, plan_for_specs, role_kwargs_on
from flowrl.run.topology import started_specs


def _sizes(n: int, placement: str = "auto", **extra: str) -> list[str]:
    return [f"actor.data_parallel_size={n}", f"rollout.data_parallel_size={n}", f"ref.data_parallel_size={n}",
            f"cluster.placement={placement}", *(f"{k}={v}" for k, v in extra.items())]


def _specs(cfg):
    from flowrl.roles.specs import actor_spec, ref_spec, rollout_spec

    return [rollout_spec(cfg), actor_spec(cfg), ref_spec(cfg)]


def _smi(n: int):
    lines = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i:04d})\n" for i in range(n))

    def runner(cmd):
        assert cmd == ["nvidia-smi", "-L"]
        return lines

    return runner


def _no_smi(cmd):
    raise FileNotFoundError("nvidia-smi")


# --------------------------------------------------------------------------- the inventory
def test_the_driver_counts_gpus_without_cuda():
    assert visible_gpu_count({}, _smi(8)) == 8
    assert visible_gpu_count({}, _no_smi) == 0
    # CUDA_VISIBLE_DEVICES wins over nvidia-smi, read as CUDA reads it
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "2,3"}, _smi(8)) == 2
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,GPU-cc"}, _smi(8)) == 3
    for none in ("", "-1", "NoDevFiles", "0,-1"[2:]):
        assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": none}, _smi(8)) == 0
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0,1,-1,3"}, _smi(8)) == 2
    assert local_inventory({}, _smi(2)) == Inventory(nodes=1, gpus_per_node=2, source="this machine")


def test_flowrl_devices_forces_cpu_or_declares_gpus():
    cfg = load_config(None, [])
    assert run_inventory(cfg, environ={}, runner=_smi(8)).gpus_per_node == 8
    assert run_inventory(cfg, environ={DEVICES_ENV: "cpu"}, runner=_smi(8)).gpus_per_node == 0
    assert run_inventory(cfg, environ={DEVICES_ENV: "auto"}, runner=_smi(4)).gpus_per_node == 4
    inv = parse_devices("8x2")
    assert (inv.gpus_per_node, inv.nodes) == (8, 2)
    with pytest.raises(ConfigError) as err:
        parse_devices("lots")
    assert err.value.key == DEVICES_ENV and "GxN" in str(err.value)


def test_address_clusters_are_cpu_and_slurm_is_its_jobs():
    address = load_config(None, ["cluster.kind=address", "cluster.scheduler_address=tcp://10.0.0.1:8786"])
    assert run_inventory(address, environ={}, runner=_smi(8)).gpus_per_node == 0
    assert run_inventory(address, environ={DEVICES_ENV: "4x2"}, runner=_no_smi).total_gpus == 8
    slurm = load_config(None, _sizes(16, "hybrid", **{"cluster.kind": "slurm", "cluster.slurm.gpus_per_job": 8,
                                                      "cluster.slurm.processes": 8, "cluster.slurm.cores": 16}))
    inv = run_inventory(slurm, environ={}, runner=_no_smi)  # the login node has no GPU; the jobs do
    assert (inv.nodes, inv.gpus_per_node) == (2, 8)


# --------------------------------------------------------------------------- specs placed by the plan
def _placed(cfg, devices: str):
    specs, _ = started_specs(cfg, _specs(cfg))
    plan = plan_for_specs(cfg, specs, environ={DEVICES_ENV: devices})
    return specs, place_specs(specs, plan)


def _dtypes_of(kwargs: dict) -> list:
    parts = kwargs.get("parts")
    return [kw.get("dtype") for _, kw in parts.values()] if parts else [kwargs.get("dtype")]


def _without_dtype(kwargs: dict) -> dict:
    parts = kwargs.get("parts")
    if parts:
        return {**kwargs, "parts": {n: (c, {k: v for k, v in kw.items() if k != "dtype"}) for n, (c, kw) in parts.items()}}
    return {k: v for k, v in kwargs.items() if k != "dtype"}


@pytest.mark.parametrize("placement", ["auto", "colocated", "split"])
def test_the_cpu_path_is_unchanged(placement):
    """On a machine without GPUs: with ``model.dtype=float32`` the very same specs (gloo, no
    placements, the same role kwargs objects); with the default dtype only ``auto`` becomes fp32."""
    cfg = load_config(None, ["cluster.placement=" + placement, "model.dtype=float32"])
    specs, placed = _placed(cfg, "cpu")
    assert placed == specs
    assert all(p.role_kwargs is s.role_kwargs for p, s in zip(placed, specs, strict=True))
    assert {p.backend for p in placed} == {CPU_BACKEND} and all(p.placements == () for p in placed)
    specs, placed = _placed(load_config(None, ["cluster.placement=" + placement]), "cpu")
    for p, s in zip(placed, specs, strict=True):
        assert (p.name, p.role_cls, p.mesh, p.backend, p.placements) == (s.name, s.role_cls, s.mesh, CPU_BACKEND, ())
        assert set(_dtypes_of(p.role_kwargs)) == {"float32"}
        assert _without_dtype(p.role_kwargs) == _without_dtype(s.role_kwargs)


@pytest.mark.parametrize("placement,gpus", [(p, g) for p in ("hybrid", "colocated") for g in (1, 2, 8)]
                         + [("split", 3), ("split", 8)])
def test_every_gpu_rank_gets_its_own_device(gpus, placement):
    per_group = gpus if placement != "split" else gpus // 3  # split: three disjoint pools
    cfg = load_config(None, _sizes(per_group, placement))
    specs, placed = _placed(cfg, str(gpus))
    if placement == "hybrid":
        assert [s.name for s in placed] == [HYBRID_GROUP]
    for spec in placed:
        assert spec.backend == GPU_BACKEND
        assert len(spec.placements) == spec.mesh.world_size
        visible = [p["gpus"] for p in spec.placements]
        assert len(set(visible)) == len(visible)  # two ranks of a group never share a GPU
        assert [p["local_rank"] for p in spec.placements] == list(range(spec.mesh.world_size))
        assert all(p["backend"] == GPU_BACKEND and p["pool_node"] == 0 for p in spec.placements)
        parts = spec.role_kwargs.get("parts")
        for kwargs in ([kw for _, kw in parts.values()] if parts else [spec.role_kwargs]):
            assert kwargs["device"] == GPU_DEVICE
        assert "device" not in spec.role_kwargs or not parts  # the hybrid role itself takes none
    if placement == "split":  # disjoint pools: no GPU shared between groups
        used = [g for s in placed for p in s.placements for g in p["gpus"]]
        assert len(used) == len(set(used))
        assert len(used) == 3 * per_group
    else:  # shared pools: rank r of every group on GPU r
        assert {tuple(p["gpus"] for p in s.placements) for s in placed} == {tuple((r,) for r in range(gpus))}


def test_two_nodes_of_eight_on_slurm():
    cfg = load_config(None, _sizes(16, "colocated", **{"cluster.kind": "slurm", "cluster.slurm.gpus_per_job": 8,
                                                       "cluster.slurm.processes": 24, "cluster.slurm.cores": 24}))
    specs, _ = started_specs(cfg, _specs(cfg))
    placed = place_specs(specs, plan_for_specs(cfg, specs, environ={}))
    for spec in placed:
        assert [(p["pool_node"], p["gpus"], p["local_rank"]) for p in spec.placements] == \
            [(r // 8, (r % 8,), r % 8) for r in range(16)]
        assert spec.backend == GPU_BACKEND


def test_only_auto_dtype_is_resolved_and_no_other_kwarg_moves():
    kwargs = {"model_dir": "m", "dtype": "auto", "micro_batch_size": 2}
    assert role_kwargs_on(kwargs, dtype="float32", device=None) == {"model_dir": "m", "dtype": "float32",
                                                                     "micro_batch_size": 2}
    assert role_kwargs_on(kwargs, dtype="bfloat16", device="cuda:0") == {**kwargs, "dtype": "bfloat16",
                                                                         "device": "cuda:0"}
    named = {"dtype": "float32", "x": 1}
    assert role_kwargs_on(named, dtype="bfloat16", device=None) is named
    assert role_kwargs_on(named, dtype="bfloat16", device="cuda:0") == {"dtype": "float32", "x": 1, "device": "cuda:0"}
    hybrid = {"parts": {"actor": ("p:P", {"dtype": "auto"}), "rollout": ("r:R", {"dtype": "float32"})}, "num_threads": 2}
    out = role_kwargs_on(hybrid, dtype="bfloat16", device="cuda:0")
    assert out == {"parts": {"actor": ("p:P", {"dtype": "bfloat16", "device": "cuda:0"}),
                             "rollout": ("r:R", {"dtype": "float32", "device": "cuda:0"})}, "num_threads": 2}
    # a CPU spec with dtype=auto gets fp32 and nothing else
    spec = GroupSpec("actor", "p:P", {"dtype": "auto", "k": 1}, GroupMesh(dp=2))
    plan = plan_for_specs(load_config(None, ["actor.data_parallel_size=2", "rollout.data_parallel_size=2"]), [spec],
                          environ={DEVICES_ENV: "cpu"})
    (placed,) = place_specs([spec], plan)
    assert placed.role_kwargs == {"dtype": "float32", "k": 1} and placed.backend == "gloo" and placed.placements == ()


def test_a_plan_for_other_groups_is_refused():
    cfg = load_config(None, _sizes(2, "colocated"))
    specs = _specs(cfg)
    plan = plan_for_specs(cfg, specs, environ={DEVICES_ENV: "2"})
    with pytest.raises(ValueError, match="made for other groups"):
        place_specs([dataclasses.replace(specs[0], name="teacher")], plan)


# --------------------------------------------------------------------------- refused before workers start
def test_more_nccl_ranks_than_gpus_is_refused_before_the_cluster_starts(monkeypatch, tmp_path):
    import flowrl.run.topology as topology

    started = []

    class FakeSession:
        @classmethod
        def start(cls, *args, **kwargs):
            started.append(kwargs)
            raise AssertionError("no worker may start")

    monkeypatch.setattr(topology, "Session", FakeSession)
    monkeypatch.setenv(DEVICES_ENV, "1")
    cfg = load_config(None, _sizes(2, "colocated"))
    for call in (lambda: topology.plan_devices_for(cfg, _specs(cfg)),  # the driver's pre-flight
                 lambda: topology.start_groups(cfg, _specs(cfg), tmp_path)):
        with pytest.raises(ConfigError) as err:
            call()
        assert err.value.key == "actor.data_parallel_size" and "at most 1" in str(err.value)
    assert started == []


def test_start_groups_hands_the_session_placed_specs(monkeypatch, tmp_path):
    import flowrl.run.topology as topology

    seen = {}

    class FakeSession:
        @classmethod
        def start(cls, num_workers, **kwargs):
            seen["group_sizes"] = kwargs["group_sizes"]
            return cls()

        client = None

        def create_groups(self, specs):
            seen["specs"] = specs
            return {s.name: s for s in specs}

        def close(self):
            pass

    monkeypatch.setattr(topology, "Session", FakeSession)
    monkeypatch.setattr(topology, "write_run_info", lambda *a: None)
    monkeypatch.setattr(topology, "add_views", lambda groups, views: groups)
    monkeypatch.setenv(DEVICES_ENV, "4")
    cfg = load_config(None, _sizes(4, "hybrid"))
    topology.start_groups(cfg, _specs(cfg), tmp_path)
    (spec,) = seen["specs"]
    assert spec.name == HYBRID_GROUP and seen["group_sizes"] == {HYBRID_GROUP: 4}
    assert spec.backend == GPU_BACKEND and [p["gpus"] for p in spec.placements] == [(0,), (1,), (2,), (3,)]


# --------------------------------------------------------------------------- the worker's environment
class FakeCuda:
    def __init__(self, environ: dict, calls: list) -> None:
        self.environ, self.calls, self.initialized = environ, calls, False

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        self.calls.append(("device_count", self.environ.get("CUDA_VISIBLE_DEVICES")))
        return len(self.environ["CUDA_VISIBLE_DEVICES"].split(","))

    def set_device(self, index: int) -> None:
        self.calls.append(("set_device", index, self.environ.get("CUDA_VISIBLE_DEVICES")))
        self.initialized = True


def test_a_slurm_job_s_gpus_are_read_through_its_visible_list():
    """Every process of a job starts with the job's GPUs; plan index g is the g-th of them."""
    environ = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    torch = SimpleNamespace(cuda=FakeCuda(environ, []))
    assert apply_placement({"gpus": (2,), "local_rank": 2}, torch=torch, environ=environ) == "cuda:0"
    assert environ["CUDA_VISIBLE_DEVICES"] == "6" and environ[NODE_DEVICES_ENV] == "4,5,6,7"
    # a vLLM replica's engine rank of tp 2, placed in a fresh process of the same job
    environ = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    apply_placement({"gpus": (2, 3), "local_rank": 1}, torch=SimpleNamespace(cuda=FakeCuda(environ, [])),
                    environ=environ)
    assert environ["CUDA_VISIBLE_DEVICES"] == "6,7"
    with pytest.raises(RuntimeError, match="gives fewer GPUs than the plan"):
        apply_placement({"gpus": (4,), "local_rank": 4}, torch=SimpleNamespace(cuda=FakeCuda({}, [])),
                        environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    environ = {}  # a local cluster whose driver set nothing: the plan's indices as they are
    apply_placement({"gpus": (3,), "local_rank": 3}, torch=SimpleNamespace(cuda=FakeCuda(environ, [])), environ=environ)
    assert environ == {"CUDA_VISIBLE_DEVICES": "3", "LOCAL_RANK": "3"}


def _slurm_workers(jobs: int, per_job: int, pool: str = "actor_rollout_ref"):
    workers, resources = {}, {}
    for j in range(jobs):
        for i in range(per_job):
            address = f"tcp://10.0.{j}.1:{4000 + 10 * j + i}"
            workers[address] = {"name": f"flowrl-ab12cd34-{j + 1}-{i}", "host": "10.0.0.1"}  # one host, two jobs
            resources[address] = {pool: 1}
    return workers, resources


def test_worker_nodes_by_kind():
    workers, _ = _slurm_workers(2, 2)
    assert sorted(set(worker_nodes(workers, "slurm", processes=2).values())) == ["flowrl-ab12cd34-1", "flowrl-ab12cd34-2"]
    single = {"tcp://a:1": {"name": "flowrl-x-10"}, "tcp://a:2": {"name": "flowrl-x-9"}}
    assert worker_nodes(single, "slurm", processes=1) == {"tcp://a:1": "flowrl-x-10", "tcp://a:2": "flowrl-x-9"}
    assert set(worker_nodes(workers, "local").values()) == {"0"}
    assert set(worker_nodes(workers, "address").values()) == {"10.0.0.1"}


def test_a_rank_runs_on_a_worker_of_its_plan_node():
    workers, resources = _slurm_workers(2, 8)
    nodes = worker_nodes(workers, "slurm", processes=8)
    free = sorted(workers)[::-1]  # whatever order the scheduler lists them in
    rank_nodes = [r // 8 for r in range(16)]
    chosen = choose_workers(free, resources, "actor_rollout_ref", 16, rank_nodes=rank_nodes, nodes=nodes)
    assert [nodes[a] for a in chosen] == [f"flowrl-ab12cd34-{1 + r // 8}" for r in range(16)]
    assert len(set(chosen)) == 16
    with pytest.raises(RuntimeError, match="on 2 node"):  # one job cannot hold a two-node plan
        one_job = {a: n for a, n in nodes.items() if n.endswith("-1")}
        choose_workers(sorted(one_job), resources, "actor_rollout_ref", 8, rank_nodes=[1] * 8, nodes=one_job)
    with pytest.raises(RuntimeError, match="no free worker left"):
        choose_workers(free, resources, "actor_rollout_ref", 9, rank_nodes=[0] * 9, nodes=nodes)


def test_on_a_local_cluster_the_choice_is_as_before():
    free = [f"tcp://127.0.0.1:{p}" for p in (4001, 4002, 4003, 4004)]
    resources = {a: {"p": 1} for a in free}
    nodes = worker_nodes({a: {} for a in free}, "local")
    assert choose_workers(free, resources, "p", 3, rank_nodes=[0, 0, 0], nodes=nodes) == \
        choose_workers(free, resources, "p", 3) == free[:3]


# --------------------------------------------------------------------------- a rank's set-up order
class FakeDist:
    def __init__(self, calls: list, environ: dict) -> None:
        self.calls, self.environ = calls, environ

    def init_process_group(self, backend, store, rank, world_size, timeout, device_id=None):
        self.calls.append(("init_process_group", backend, device_id, self.environ.get("CUDA_VISIBLE_DEVICES")))


def _setup(monkeypatch, placement, backend):
    import flowrl.actors.rank as rank_module
    from flowrl.actors.rank import RankActor

    environ = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    monkeypatch.setattr(os, "environ", environ)
    calls: list = []
    torch = SimpleNamespace(cuda=FakeCuda(environ, calls), set_num_threads=lambda n: calls.append(("threads", n)),
                            device=lambda d: ("device", d))
    monkeypatch.setattr(rank_module, "_torch_modules", lambda: (torch, FakeDist(calls, environ)))
    monkeypatch.setattr(rank_module, "rendezvous_store", lambda *a: "store")

    class Role:
        def __init__(self, **kwargs):
            calls.append(("role", kwargs))

    monkeypatch.setattr(rank_module, "import_string", lambda path: Role)
    actor = RankActor("actor", 1, 2)
    try:
        info = actor._setup(("127.0.0.1", 1234), "x:Role", {"dtype": "float32"}, backend, 60.0, placement)
    finally:
        actor._executor.shutdown(wait=False)
    return info, calls, environ


def test_a_gpu_rank_is_placed_before_it_joins_its_group(monkeypatch):
    placement = {"gpus": (1,), "local_rank": 1, "backend": GPU_BACKEND, "dtype": "bfloat16", "node": 0, "pool_node": 0}
    info, calls, environ = _setup(monkeypatch, placement, GPU_BACKEND)
    assert [c[0] for c in calls] == ["device_count", "set_device", "threads", "init_process_group", "role"]
    assert calls[1] == ("set_device", 0, "1")  # the rank's GPU only, then its device
    assert calls[3] == ("init_process_group", GPU_BACKEND, ("device", "cuda:0"), "1")
    assert info["device"] == "cuda:0" and info["backend"] == GPU_BACKEND and environ["LOCAL_RANK"] == "1"


def test_a_cpu_rank_sets_up_as_before(monkeypatch):
    info, calls, environ = _setup(monkeypatch, None, "gloo")
    assert [c[0] for c in calls] == ["threads", "init_process_group", "role"]
    assert calls[1] == ("init_process_group", "gloo", None, None)
    assert "LOCAL_RANK" not in environ or environ.get("LOCAL_RANK") == os.environ.get("LOCAL_RANK")
    assert info["device"] == "cpu" and info["backend"] == "gloo"


def test_slurm_jobs_that_cannot_hold_the_plan_s_nodes_are_refused_before_submission():
    """Colocated 3 x 16 ranks on 2 nodes of 8 GPUs: 24 ranks per node, so 24 workers per job."""
    over = {"cluster.kind": "slurm", "cluster.slurm.gpus_per_job": 8, "cluster.slurm.cores": 48}
    for processes in (8, 48):  # too few per job; too many (one job for two nodes)
        cfg = load_config(None, _sizes(16, "colocated", **over, **{"cluster.slurm.processes": processes}))
        with pytest.raises(ConfigError) as err:
            plan_for_specs(cfg, _specs(cfg), environ={})
        assert err.value.key == "cluster.slurm.processes" and "cluster.slurm.processes=24" in str(err.value)
    cfg = load_config(None, _sizes(16, "hybrid", **over, **{"cluster.slurm.processes": 8}))
    specs, _ = started_specs(cfg, _specs(cfg))
    assert plan_for_specs(cfg, specs, environ={}).inventory.nodes == 2  # hybrid: 8 processes per node fit
    assert plan_for_specs(cfg, specs, environ={DEVICES_ENV: "cpu"}).inventory.gpus_per_node == 0  # CPU: no check

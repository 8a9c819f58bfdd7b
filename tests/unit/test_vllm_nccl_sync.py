"""The split placement's weight sync over vLLM's NCCL weight transfer
(:mod:`flowrl.backends.generate.vllm_nccl`), on the CPU: the path choice, which trainer rank sends
to which engine, the planner's gather onto the senders, and the calls each side makes, recorded by
a fake communicator (vLLM's ``PyNcclCommunicator``: ``broadcast(tensor, src, stream)``) and a fake
``vllm.LLM``. The fake engine receives a bucket's broadcasts inside its ``update_weights``, as
vLLM's worker does, so the trainer's sends are checked in step with the engine's calls. The
payloads' passage through vLLM's own parsers is ``tests/vllm_env/check_nccl_payload.py``."""

import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch

from flowrl.backends.generate import vllm as vbackend
from flowrl.backends.generate.vllm_nccl import (
    NcclSyncJob, choose_weight_path, nccl_sync_job, run_engine_rank, run_trainer_rank, sender_ranks, update_info)
from flowrl.backends.reshard.job import make_job
from flowrl.comm import JointSpec
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape
from flowrl_testing.reshard import expected_shard, synthetic_shard
from flowrl_testing.thread_group import ThreadGroup

SHAPE = ModelShape(vocab_size=61, hidden_size=16, ffn_hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=4)
TIMEOUT_S = 30.0
GPUS = [(0, g) for g in range(8)]


# --------------------------------------------------------------------------- the path
def test_split_vllm_on_gpus_of_their_own_takes_nccl():
    path = choose_weight_path(placement="split", trainer_devices=GPUS[:2], engine_devices=GPUS[2:4],
                              engine="vllm", lora=False)
    assert path.name == "nccl"


@pytest.mark.parametrize("kw, why", [
    ({"engine": "hf"}, "rollout.name=hf"),
    ({"lora": True}, "LoRA"),
    ({"placement": "hybrid"}, "placement hybrid"),
    ({"placement": "colocated", "engine_devices": GPUS[:2]}, "share a GPU"),  # one pool: the same GPUs
    ({"trainer_devices": (), "engine_devices": ()}, "CPU"),  # no device plan: CPU groups
    ({"engine_devices": [(0, 2), None]}, "no GPU"),
    ({"engine_devices": [(0, 1), (0, 2)]}, "share a GPU"),  # trainer rank 1 and engine rank 0 on GPU 1
    ({"engine_devices": [(0, 2), (0, 2)]}, "share a GPU"),
])
def test_anything_else_stays_staged(kw, why):
    args = {"placement": "split", "trainer_devices": GPUS[:2], "engine_devices": GPUS[2:4], "engine": "vllm",
            "lora": False, **kw}
    path = choose_weight_path(**args)
    assert path.name == "staged" and why in path.reason


def test_pools_that_keep_the_groups_apart_count_as_split():
    path = choose_weight_path(placement="colocated", trainer_devices=GPUS[:2], engine_devices=GPUS[2:4],
                              engine="vllm", lora=False)
    assert path.name == "nccl"


def test_a_second_node_is_other_gpus():
    path = choose_weight_path(placement="split", trainer_devices=[(0, 0), (0, 1)], engine_devices=[(1, 0), (1, 1)],
                              engine="vllm", lora=False)
    assert path.name == "nccl"


@pytest.mark.parametrize("trainers, engines, senders", [
    (4, 2, (0, 2)),  # spread: one engine per sender, every other trainer rank
    (4, 4, (0, 1, 2, 3)),
    (1, 3, (0, 0, 0)),  # one trainer rank serves every engine (one NCCL group each)
    (2, 3, (0, 1, 0)),
    (3, 1, (0,)),
])
def test_senders(trainers, engines, senders):
    assert sender_ranks(trainers, engines) == senders


# --------------------------------------------------------------------------- the job
def _job(src=(2, 2, 1), dst=(2, 2, 1), src_style="megatron", bucket_bytes=2048, wire="float32"):
    s, d = ParallelDims(dp=src[0], tp=src[1], pp=src[2]), ParallelDims(dp=dst[0], tp=dst[1], pp=dst[2])
    joint = JointSpec("actor+rollout", "", 0, s.world_size + d.world_size)
    split = make_job(SHAPE, src=s, dst=d, placement="split", src_style=src_style, dst_style="vllm", joint=joint,
                     wire_dtype=wire, make_vocab_size_divisible_by=4)
    engines = d.world_size // d.tp
    return nccl_sync_job(split, engine_tp=d.tp, endpoints=[("10.0.0.1", 29500 + e) for e in range(engines)],
                         model_dir=None, bucket_bytes=bucket_bytes)


def test_init_info_is_one_group_per_engine_sender_at_rank_0():
    job = _job()
    assert job.senders == (0, 2) and job.engines_of(2) == [1] and job.engines_of(1) == []
    assert job.init_info(1) == {"master_address": "10.0.0.1", "master_port": 29501, "rank_offset": 1,
                                "world_size": 3, "packed": False}
    assert job.trainer_init_info(1) == {"master_address": "10.0.0.1", "master_port": 29501, "world_size": 3}
    with pytest.raises(ValueError, match="endpoints"):
        NcclSyncJob(reshard=job.reshard, engine_tp=2, endpoints=(("h", 1),))


def test_buckets_cover_the_full_model_in_order_within_the_budget():
    job = _job(bucket_bytes=2048)
    full = job.gather_job().specs()[1].params
    buckets = job.buckets()
    assert [n for b in buckets for n, _ in b] == list(full)  # every tensor once, the model's order
    assert all(tuple(s) == full[n] for b in buckets for n, s in b)
    sizes = [sum(4 * torch.Size(s).numel() for _, s in b) for b in buckets]
    big = max(4 * torch.Size(s).numel() for s in full.values())
    assert len(buckets) > 1 and all(n <= max(2048, big) for n in sizes)
    infos = job.update_infos()
    assert infos[0] == update_info(buckets[0], "float32") and set(infos[0]) == {"names", "dtype_names", "shapes"}


def test_the_gather_moves_only_what_the_senders_lack():
    # trainer megatron tp=2 x dp=2: senders 0 and 2 each hold half of every tp-split tensor;
    # full replicas (dp=4, hf) hold everything: nothing to move
    mp = _job(src=(2, 2, 1)).gather_job()
    assert mp.placement.src == (0, 1, 2, 3) and mp.placement.dst == (0, 2) and mp.placement.kind == "colocated"
    moved = mp.summary()
    assert moved.bytes_sent == moved.bytes_min > 0  # exactly the halves each sender lacks
    dp = _job(src=(4, 1, 1), src_style="hf").gather_job()
    assert dp.summary().bytes_sent == 0


# --------------------------------------------------------------------------- a sync, in step
class FakeComm:
    """vLLM's ``PyNcclCommunicator`` as the sender sees it: each broadcast is posted to its
    engine's channel (what the engine's workers receive, in order)."""

    def __init__(self, init_info, channels, log):
        self.init_info, self.channel, self.log = init_info, channels[init_info["master_port"]], log

    def broadcast(self, tensor, src, stream=None):
        assert src == 0
        self.log.append(("broadcast", self.init_info["master_port"], tensor.shape))
        self.channel.put(tensor.clone())


class FakeLLM:
    """``vllm.LLM``'s weight-transfer calls; ``update_weights`` takes the bucket's tensors from the
    channel (blocking, as the worker's NCCL receives do) and checks them against the update info."""

    def __init__(self, channels, port):
        self.calls, self.channels, self.port, self.received = [], channels, port, {}

    def collective_rpc(self, name, args=()):
        self.calls.append(("rpc", name, args))
        return ["NCCLWeightTransferEngine"]

    def init_weight_transfer_engine(self, request):
        self.calls.append(("init_weight_transfer_engine", request["init_info"]))

    def start_weight_update(self):
        self.calls.append(("start_weight_update",))

    def update_weights(self, request):
        info = request["update_info"]
        self.calls.append(("update_weights", tuple(info["names"])))
        for name, dtype, shape in zip(info["names"], info["dtype_names"], info["shapes"]):
            got = self.channels[self.port].get(timeout=TIMEOUT_S)
            assert list(got.shape) == shape and str(got.dtype) == f"torch.{dtype}", name
            self.received[name] = got

    def finish_weight_update(self):
        self.calls.append(("finish_weight_update",))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags)))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def _engine(channels, port):
    gen = object.__new__(vbackend.VLLMGenerator)
    gen.llm, gen.on_cuda, gen.external_launcher, gen.model_dir = FakeLLM(channels, port), True, False, None
    return gen


def _sync(job, engines, senders, log, channels, fingerprint=False):
    """One sync: every trainer rank (threads, the gather on a ThreadGroup) and every generation
    rank at once, as the reshard node calls them."""
    t = job.num_trainer_ranks
    src_spec = job.reshard.specs()[0]
    boxes: dict = {}
    groups = {r: ThreadGroup(r, boxes, timeout_s=TIMEOUT_S) for r in range(t)}

    def opener(info):
        log.append(("open", info["master_port"]))
        return FakeComm(info, channels, log)

    def trainer(r):
        src = synthetic_shard(src_spec, r, torch.float32)
        stats, senders[r] = run_trainer_rank(job, r, src, senders.get(r), pg=groups[r], opener=opener,
                                             fingerprint=fingerprint)
        return stats

    def generation(r):
        return run_engine_rank(job, r, engines.get(r))

    dst_world = job.reshard.dst_dims.world_size
    with ThreadPoolExecutor(t + dst_world) as pool:
        tf = [pool.submit(trainer, r) for r in range(t)]
        gf = [pool.submit(generation, r) for r in range(dst_world)]
        return [f.result(timeout=TIMEOUT_S) for f in tf], [f.result(timeout=TIMEOUT_S) for f in gf]


def test_two_syncs_init_once_then_start_bucket_by_bucket_finish():
    job = _job()  # trainer megatron tp2 x dp2 -> two vLLM engines of tp 2, senders 0 and 2
    channels = {29500: queue.Queue(), 29501: queue.Queue()}
    engines = {0: _engine(channels, 29500), 2: _engine(channels, 29501)}  # generation ranks 0, 2 hold them
    log, senders = [], {}
    for _ in range(2):
        trainer_stats, gen_stats = _sync(job, engines, senders, log, channels)
    infos = job.update_infos()
    for e, rank in enumerate((0, 2)):
        calls = engines[rank].llm.calls
        per_sync = [("start_weight_update",), *[("update_weights", tuple(i["names"])) for i in infos],
                    ("finish_weight_update",), ("reset_prefix_cache",)]
        assert calls == [("rpc", "flowrl_use_weight_transfer", ("nccl",)),
                         ("init_weight_transfer_engine", job.init_info(e)), *per_sync, *per_sync]
        want = expected_shard(job.gather_job().specs()[1], 0, torch.float32)  # the full model
        got = engines[rank].llm.received
        assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want)
    # the endpoints were opened once, by the senders; only senders broadcast, the whole model per engine
    assert sorted(entry for entry in log if entry[0] == "open") == [("open", 29500), ("open", 29501)]
    assert set(senders) == {0, 1, 2, 3} and senders[1] is None and senders[3] is None
    model = sum(torch.Size(s).numel() for s in job.gather_job().specs()[1].params.values()) * 4
    assert [s["nccl_bytes_sent"] for s in trainer_stats] == [model, 0, model, 0]
    assert trainer_stats[1]["bytes_sent"] > 0 and trainer_stats[0]["bytes_received"] > 0  # the planner's gather
    assert [s["bytes_received"] for s in gen_stats] == [2 * model, 0, 2 * model, 0]  # tp 2: each worker, whole
    assert all(c.empty() for c in channels.values())


def test_full_replicas_on_every_trainer_rank_gather_nothing():
    job = _job(src=(2, 1, 1), src_style="hf", dst=(1, 2, 1))  # dp strategy, one engine of tp 2
    channels = {29500: queue.Queue()}
    engines = {0: _engine(channels, 29500)}
    trainer_stats, _ = _sync(job, engines, {}, [], channels)
    assert [s["bytes_received"] for s in trainer_stats] == [0, 0] and trainer_stats[1]["bytes_sent"] == 0


def test_a_sleeping_engine_wakes_weights_receives_then_wakes_the_kv_cache():
    job = _job(src=(1, 1, 1), src_style="hf", dst=(1, 1, 1))
    channels = {29500: queue.Queue()}
    gen = _engine(channels, 29500)
    gen._sleeping = frozenset(vbackend.SLEEP_TAGS)
    sender = threading.Thread(target=run_trainer_rank, args=(job, 0, synthetic_shard(job.reshard.specs()[0], 0,
                              torch.float32), None), kwargs={"pg": ThreadGroup(0, {}), "opener": lambda i: FakeComm(i, channels, [])})
    sender.start()
    run_engine_rank(job, 0, gen)
    sender.join(TIMEOUT_S)
    names = [c[0] for c in gen.llm.calls if c[0] != "update_weights"]
    assert names == ["rpc", "init_weight_transfer_engine", "wake_up", "start_weight_update", "finish_weight_update",
                     "wake_up", "reset_prefix_cache"]
    assert [c for c in gen.llm.calls if c[0] == "wake_up"] == [("wake_up", ("weights",)), ("wake_up", ("kv_cache",))]


def test_an_engine_in_the_trainers_processes_refuses_it():
    gen = _engine({}, 0)
    gen.external_launcher = True
    with pytest.raises(RuntimeError, match="external_launcher"):
        run_engine_rank(_job(src=(1, 1, 1), src_style="hf", dst=(1, 1, 1)), 0, gen)
    assert gen.llm.calls == []


# --------------------------------------------------------------------------- the node's choice
class _Actor:
    def __init__(self, host, calls):
        self.host, self.calls = host, calls

    def host_port(self):
        self.calls.append(self.host)
        done = Future()
        done.set_result((self.host, 40000 + len(self.calls)))
        return done


def _group(hosts, devices, calls):
    return SimpleNamespace(addresses=[f"tcp://{h}:1" for h in hosts], actors=[_Actor(h, calls) for h in hosts],
                           devices=tuple(devices), world_size=len(hosts), timeout_s=5.0)


def test_the_sync_node_wraps_the_split_job_once_per_run_and_leaves_the_rest(monkeypatch):
    from flowrl.nodes import weights

    monkeypatch.setattr(weights, "_NCCL_ENDPOINTS", {})
    cfg = SimpleNamespace(cluster=SimpleNamespace(placement="split"), model=SimpleNamespace(path=None),
                          rollout=SimpleNamespace(name="vllm", tensor_model_parallel_size=2))
    split = _job().reshard
    calls = []
    actor = _group(["a0", "a1", "a2", "a3"], GPUS[:4], calls)
    rollout = _group(["r0", "r1", "r2", "r3"], GPUS[4:8], calls)
    first = weights._nccl_job(cfg, actor, rollout, split)
    again = weights._nccl_job(cfg, actor, rollout, split)
    assert isinstance(first, NcclSyncJob) and first.reshard is split and first.engine_tp == 2
    assert first.endpoints == again.endpoints == (("a0", 40001), ("a2", 40002)) and calls == ["a0", "a2"]
    cpu = _group(["r0", "r1", "r2", "r3"], (), calls)
    assert weights._nccl_job(cfg, actor, cpu, split) is split  # CPU: the staged sync, as before
    shared = _group(["r0", "r1", "r2", "r3"], GPUS[:4], calls)
    assert weights._nccl_job(cfg, actor, shared, split) is split


def test_the_weight_sync_check_compares_what_the_senders_broadcast_with_the_trainer(monkeypatch):
    """``trainer.checks.weight_sync`` on this path: every trainer rank reports its shard, each
    sender the whole tensors it broadcasts; the node's comparison finds them equal, and names the
    parameter when a sender's copy is wrong (here: the gather corrupted on sender 2)."""
    from flowrl.backends import reshard as reshard_pkg
    from flowrl.nodes.weights import verify_fingerprints

    job = _job()  # megatron tp2 x dp2 -> two engines of tp 2, senders 0 and 2
    ports = (29500, 29501)

    def run(fingerprint_mode):
        channels = {p: queue.Queue() for p in ports}
        engines = {0: _engine(channels, ports[0]), 2: _engine(channels, ports[1])}
        trainer_stats, gen_stats = _sync(job, engines, {}, [], channels, fingerprint=True)
        reports = [r for st in trainer_stats for r in st["fingerprint"]]
        assert sorted((r["side"], r["rank"]) for r in reports) == [
            ("dst", 0), ("dst", 1), ("src", 0), ("src", 1), ("src", 2), ("src", 3)]  # senders' copies: dst 0, 1
        return verify_fingerprints(trainer_stats + gen_stats, fingerprint_mode)

    clean = run("error")
    params = len(job.gather_job().specs()[1].params)
    assert clean["reshard/fingerprint_params"] == params and clean["reshard/fingerprint_mismatch"] == 0

    real_run_rank = reshard_pkg.run_rank

    def corrupting(gather, *, src_rank, dst_rank, src, dst, pg):
        out = real_run_rank(gather, src_rank=src_rank, dst_rank=dst_rank, src=src, dst=dst, pg=pg)
        if dst_rank == 1:  # sender 2's copy of one tensor
            next(iter(dst.values())).add_(1.0)
        return out

    monkeypatch.setattr(reshard_pkg, "run_rank", corrupting)
    bad = run("warn")
    assert bad["reshard/fingerprint_mismatch"] == 1
    from flowrl.checks.fingerprint import WeightSyncMismatch

    with pytest.raises(WeightSyncMismatch, match=r"1 of \d+ parameters differ between the trainer and the generation"):
        run("error")

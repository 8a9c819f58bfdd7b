"""The reshard's wire (issues 28, 29): which one a reshard takes (``wire_plan.choose_wire``, from
the device plan and the group's backend), the canonical order of a batched round (both ends
derive the same sequence from their own plans) and the batched round transport run by threads
over an in-process group (no process group, no GPU): the same destination tensors and the same
byte accounting as the host wire.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from flowrl.actors.device import placement_of, rank_gpus
from flowrl.actors.dispatch import GroupMesh
from flowrl.actors.group import WorkerGroup
from flowrl.backends.reshard import exchange
from flowrl.backends.reshard.job import make_job, with_devices
from flowrl.backends.reshard.rounds import BatchedRounds, group_backend
from flowrl.backends.reshard.wire import HOST
from flowrl.backends.reshard.wire_plan import (
    WIRE_ENV,
    choose_wire,
    cuda_backend,
    message_key,
    process_devices,
    round_order,
    shared_gpus,
    wire_request,
)
from flowrl.comm import JointSpec
from flowrl.nodes.weights import reshard_metrics
from flowrl.parallel.device_plan import GroupLayout, Inventory, plan_devices
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape
from flowrl_testing.reshard import expected_shard, synthetic_shard
from flowrl_testing.thread_group import ThreadGroup

SHAPE = ModelShape(vocab_size=61, hidden_size=16, ffn_hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=4)
WIRE = torch.float32
TIMEOUT_S = 60.0
NCCL = "cpu:gloo,cuda:nccl"
# (source (dp, tp, pp), destination (dp, tp, pp), placement, styles)
CASES = {
    "TP2 -> DP2 colocated": ((1, 2, 1), (2, 1, 1), "colocated", {}),
    "TP2xPP2 -> TP2xDP2 vllm colocated": ((1, 2, 2), (2, 2, 1), "colocated", {"dst_style": "vllm"}),
    "TP4 -> TP1xDP4 colocated": ((1, 4, 1), (4, 1, 1), "colocated", {}),
    "TP2 -> TP2 vllm split": ((1, 2, 1), (1, 2, 1), "split", {"dst_style": "vllm"}),
    "DP2 hf -> TP1xDP2 megatron split": ((2, 1, 1), (2, 1, 1), "split", {"src_style": "hf", "dst_style": "megatron"}),
}


def _dims(t):
    return ParallelDims(dp=t[0], tp=t[1], pp=t[2])


def _job(case, transport="planned", bucket=512, **kw):
    src, dst, placement, styles = CASES[case]
    joint = JointSpec("unused", "", 0, _dims(src).world_size + _dims(dst).world_size) if placement == "split" else None
    return make_job(SHAPE, src=_dims(src), dst=_dims(dst), placement=placement, transport=transport,
                    bucket_bytes=bucket, wire_dtype="float32", make_vocab_size_divisible_by=4, joint=joint,
                    **styles, **kw)


def _processes(job):
    return sorted(set(job.placement.src) | set(job.placement.dst))


# --------------------------------------------------------------------------- the choice
def _plan(inventory_gpus, *groups):
    """The device plan of ``groups`` ((name, world size, pool)) on one node of ``inventory_gpus``."""
    layouts = [GroupLayout(name=n, world_size=w, pool=p, size_key=f"{n}.data_parallel_size", size_value=w)
               for n, w, p in groups]
    return plan_devices(Inventory(nodes=1, gpus_per_node=inventory_gpus), layouts)


def _group(plan, name):
    """The group's devices as a session records them from its spec's placements."""
    return rank_gpus([placement_of(r) for r in plan.group(name)])


def test_cpu_runs_keep_the_host_wire():
    assert choose_wire("auto", backend="gloo", devices=None).name == "host"
    cpu = _plan(0, ("hybrid", 4, "p"))  # no GPU: the group is placed without placements
    assert rank_gpus(()) == () and process_devices("colocated", (), ()) is None
    assert all(r.gpus == () for r in cpu.ranks)
    choice = choose_wire("auto", backend="gloo", devices=process_devices("colocated", (), ()))
    assert (choice.name, choice.batched, choice.on_device) == ("host", False, False)
    assert "no device plan" in choice.reason


def test_a_gpu_hybrid_group_on_nccl_takes_the_device_wire():
    plan = _plan(4, ("hybrid", 4, "p"))
    devices = process_devices("colocated", _group(plan, "hybrid"), ())
    assert devices == ((0, 0), (0, 1), (0, 2), (0, 3)) and not shared_gpus(devices)
    choice = choose_wire("auto", backend=NCCL, devices=devices)
    assert (choice.name, choice.batched, choice.on_device) == ("device", True, True)
    # the same processes on a gloo-only group (the joint group), or with a host-only request: host
    assert "gloo, not nccl" in choose_wire("auto", backend="gloo", devices=devices).reason
    assert choose_wire("host", backend=NCCL, devices=devices).name == "host"
    assert choose_wire("batched", backend=NCCL, devices=devices).name == "device"


def test_trainer_and_generation_processes_sharing_gpus_stay_on_the_host():
    # cluster.placement=colocated: the actor and rollout groups share a pool, rank r on GPU r
    plan = _plan(2, ("actor", 2, "shared"), ("rollout", 2, "shared"))
    devices = process_devices("split", _group(plan, "actor"), _group(plan, "rollout"))
    assert devices == ((0, 0), (0, 1), (0, 0), (0, 1))
    assert shared_gpus(devices) == [(0, 2, (0, 0)), (1, 3, (0, 1))]
    for backend in (NCCL, "nccl"):  # even were the joint group NCCL: one rank per GPU
        choice = choose_wire("auto", backend=backend, devices=devices)
        assert choice.name == "host" and "share GPU 0 of node 0" in choice.reason
    assert choose_wire("batched", backend=NCCL, devices=devices).name == "batched"  # host buffers
    # split pools take disjoint GPUs: distinct, and NCCL would serve them; the joint group is gloo
    split = _plan(4, ("actor", 2, "a"), ("rollout", 2, "r"))
    devices = process_devices("split", _group(split, "actor"), _group(split, "rollout"))
    assert devices == ((0, 0), (0, 1), (0, 2), (0, 3))
    assert choose_wire("auto", backend=NCCL, devices=devices).name == "device"
    assert choose_wire("auto", backend="gloo", devices=devices).name == "host"


def test_a_process_without_a_gpu_or_an_unknown_backend_keeps_the_host_wire():
    assert "process(es) [1]" in choose_wire("auto", backend=NCCL, devices=((0, 0), None)).reason
    assert choose_wire("auto", backend=None, devices=((0, 0), (0, 1))).name == "host"
    assert process_devices("split", ((0, 0),), ()) is None  # a destination group without GPUs


def test_vllm_replica_ranks_are_told_apart_by_their_first_gpu():
    # a replica of tp 2: its engine rank sees GPUs (0, 1), the other rank GPU 1; each is cuda:0 of its own
    layouts = [GroupLayout(name="rollout", world_size=2, pool="r", size_key="rollout.data_parallel_size",
                           size_value=1, engine_span=2)]
    plan = plan_devices(Inventory(nodes=1, gpus_per_node=2), layouts)
    assert [r.gpus for r in plan.ranks] == [(0, 1), (1,)]
    assert _group(plan, "rollout") == ((0, 0), (0, 1))


def test_backend_strings_and_requests():
    assert [cuda_backend(b) for b in (NCCL, "nccl", "gloo", "cuda:nccl,cpu:gloo", "cpu:gloo", None, "")] == [
        "nccl", "nccl", "gloo", "nccl", None, None, None]
    assert wire_request(None, {}) == "auto"
    assert wire_request(None, {WIRE_ENV: "batched"}) == "batched"
    assert wire_request("host", {WIRE_ENV: "batched"}) == "host"  # the argument wins
    with pytest.raises(ValueError, match=WIRE_ENV):
        wire_request(None, {WIRE_ENV: "nccl"})
    with pytest.raises(ValueError, match="auto, host, batched"):
        choose_wire("fast", backend=NCCL, devices=None)


def test_group_backend_reads_a_groups_name_or_backend():
    class Named:
        def name(self):
            return "gloo"

    class Fake:
        backend = NCCL

    assert group_backend(Named()) == "gloo" and group_backend(Fake()) == NCCL and group_backend(object()) is None


def test_the_run_attaches_the_plans_gpus_to_the_job_and_views_keep_them():
    plan = _plan(4, ("hybrid", 2, "p"))
    group = WorkerGroup("hybrid", [None, None], ["w0", "w1"], GroupMesh(dp=2), devices=_group(plan, "hybrid"))
    actor, rollout = group.view("actor", "actor"), group.view("rollout", "rollout")
    assert actor.devices == rollout.devices == ((0, 0), (0, 1))
    job = with_devices(_job("TP2 -> DP2 colocated"), actor.devices, rollout.devices)
    assert job.devices == ((0, 0), (0, 1))
    assert with_devices(_job("TP2 -> DP2 colocated"), (), ()).devices is None  # CPU groups
    with pytest.raises(ValueError, match="3 entries"):
        _job("TP2 -> DP2 colocated", devices=((0, 0), (0, 1), (0, 2)))


def test_run_rank_picks_the_device_wire_on_an_nccl_group_with_the_plans_gpus(monkeypatch):
    """The whole decision at a rank, with fakes: a group whose backend says NCCL and a job whose
    devices come from a GPU plan choose ``device`` (its buffers would be on CUDA: here the fake
    transport keeps them on the host and the threads exchange them); the same job without the
    plan takes the host wire."""
    plan = _plan(4, ("hybrid", 2, "p"))
    job = with_devices(_job("TP2 -> DP2 colocated"), _group(plan, "hybrid"), ())
    chosen = []

    def rounds_on_host(choice, pg):
        chosen.append(choice.name)
        return BatchedRounds(pg, name=choice.name, device=HOST)

    monkeypatch.setattr(exchange, "make_rounds", rounds_on_host)
    results = _run_threads(job, backend=NCCL)
    assert chosen == ["device", "device"] and {s["wire"] for s, *_ in results.values()} == {"device"}
    _check_exact(job, results)
    assert reshard_metrics([s for s, *_ in results.values()], 0.1)["reshard/wire_device"] == 1.0
    monkeypatch.undo()
    host = _run_threads(_job("TP2 -> DP2 colocated"), backend=NCCL)  # no devices: no plan
    assert {s["wire"] for s, *_ in host.values()} == {"host"}
    assert reshard_metrics([s for s, *_ in host.values()], 0.1)["reshard/wire_device"] == 0.0


# --------------------------------------------------------------------------- the canonical order
def _pair_sequences(job, process):
    """{(round key, src, dst): [message keys]} of ``process``'s sends and receives, in post order."""
    out: dict = {}
    for rnd in job.rank_schedule(process).rounds:
        for kind, m in round_order(rnd.messages, process):
            out.setdefault((rnd.key, kind, m.src_process, m.dst_process), []).append(message_key(m))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("bucket", [256, 4096, None])
def test_both_ends_derive_the_same_sequence_from_their_own_plans(case, bucket):
    job = _job(case, bucket=bucket)
    seqs = {p: _pair_sequences(job, p) for p in _processes(job)}
    sends = {(key, s, d): v for p in seqs for (key, kind, s, d), v in seqs[p].items() if kind == "send"}
    recvs = {(key, s, d): v for p in seqs for (key, kind, s, d), v in seqs[p].items() if kind == "recv"}
    assert sends and sends == recvs  # the k-th send of a -> b is the k-th receive at b from a
    whole = job.schedule()  # the whole plan's rounds give every process the same order
    for rnd in whole.rounds:
        for p in _processes(job):
            mine = [r for r in job.rank_schedule(p).rounds if r.key == rnd.key]
            want = [(k, message_key(m)) for k, m in round_order(rnd.messages, p)]
            assert want == ([(k, message_key(m)) for k, m in round_order(mine[0].messages, p)] if mine else [])


def test_several_messages_of_one_pair_in_a_round_match_in_order_however_each_end_lists_them():
    # the schedule puts at most one message of a pair in a round; the order holds for any number:
    # every message of two pairs (0 -> 2, 1 -> 2) in one round, listed differently at each end
    import random

    job = _job("TP2 -> TP2 vllm split", bucket=256)
    messages = [m for rnd in job.schedule().rounds for m in rnd.messages if m.dst_process == 2]
    assert len({m.src_process for m in messages}) == 2 and len(messages) > 4
    rng = random.Random(0)
    sender = {s: rng.sample(messages, len(messages)) for s in (0, 1)}
    receiver = rng.sample(messages, len(messages))
    at_receiver = round_order(receiver, 2)
    assert [k for k, _ in at_receiver] == ["recv"] * len(messages)
    for s in (0, 1):
        sent = [message_key(m) for _, m in round_order(sender[s], s)]
        received = [message_key(m) for _, m in at_receiver if m.src_process == s]
        assert sent == received and len(sent) == sum(m.src_process == s for m in messages)


def test_order_is_by_peer_receives_first_and_independent_of_listing_order():
    job = _job("TP4 -> TP1xDP4 colocated", bucket=None)  # one round: every pair at once
    (rnd,) = job.schedule().rounds
    for p in _processes(job):
        order = round_order(rnd.messages, p)
        assert order == round_order(reversed(rnd.messages), p)
        peers = [(m.src_process if k == "recv" else m.dst_process, k) for k, m in order]
        assert peers == sorted(peers, key=lambda x: (x[0], x[1] != "recv"))
        assert {k for k, _ in order} == {"send", "recv"}


def test_senders_only_send_receivers_only_receive_and_empty_rounds_post_nothing():
    job = _job("TP2 -> TP2 vllm split", bucket=256)
    src, dst = set(job.placement.src), set(job.placement.dst)
    for p in _processes(job):
        kinds = {k for rnd in job.rank_schedule(p).rounds for k, _ in round_order(rnd.messages, p)}
        assert kinds == ({"send"} if p in src else {"recv"})
    rounds = job.schedule().rounds
    lonely = [(rnd, p) for rnd in rounds for p in _processes(job)
              if not any(p in (m.src_process, m.dst_process) for m in rnd.messages)]
    assert lonely and all(round_order(rnd.messages, p) == [] for rnd, p in lonely)
    assert round_order((), 0) == []


# --------------------------------------------------------------------------- batched rounds, threads
def _run_threads(job, *, wire=None, backend=None):
    procs = _processes(job)
    src_spec, dst_spec = job.specs()
    boxes: dict = {}
    groups = {p: ThreadGroup(p, boxes, backend, timeout_s=TIMEOUT_S) for p in procs}

    def one(p):
        src_rank, dst_rank = job.placement.src_rank_at(p), job.placement.dst_rank_at(p)
        src = synthetic_shard(src_spec, src_rank, WIRE) if src_rank is not None else None
        dst = synthetic_shard(dst_spec, dst_rank, WIRE, fill=False) if dst_rank is not None else None
        stats = exchange.run_rank(job, src_rank=src_rank, dst_rank=dst_rank, src=src, dst=dst, pg=groups[p], wire=wire)
        return stats, dst_rank, dst, groups[p]

    with ThreadPoolExecutor(len(procs)) as pool:
        futures = {p: pool.submit(one, p) for p in procs}
        results = {p: f.result(timeout=TIMEOUT_S) for p, f in futures.items()}
    assert all(b.empty() for b in boxes.values())  # every message was received
    return results


def _check_exact(job, results):
    for p, (_, dst_rank, dst, _) in results.items():
        if dst_rank is not None:
            want = expected_shard(job.specs()[1], dst_rank, WIRE)
            assert all(torch.equal(dst[k], want[k]) for k in want), p


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("transport", ["planned", "naive"])
def test_batched_rounds_land_the_same_tensors_with_the_same_accounting(case, transport):
    job = _job(case, transport)
    host = _run_threads(job)
    batched = _run_threads(job, wire="batched")
    _check_exact(job, host)
    _check_exact(job, batched)
    keys = ("bytes_sent", "bytes_received", "bytes_local", "peak_extra_bytes", "bytes_min")
    for p in host:
        assert {k: host[p][0][k] for k in keys} == {k: batched[p][0][k] for k in keys}, p
        assert (host[p][0]["wire"], batched[p][0]["wire"]) == ("host", "batched")
        assert all(tag == 0 for _, _, tag, _ in batched[p][3].posted)  # tags unused
    if transport == "planned":  # the host wire tags each message with its index in the pair
        assert any(tag for p in host for _, _, tag, _ in host[p][3].posted) or job.bucket_bytes is None

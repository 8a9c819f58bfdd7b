"""The reshard transports on any mix of devices (issue 28): every tensor that crosses between
processes is staged in host memory and travels over gloo; device tensors are copied to the host
before a send and received into host buffers, then copied onto their device. On the CPU nothing
changes: host tensors go on the wire as they are, no extra copy.

No GPU here, so "device" tensors are simulated two ways: host tensors that ``wire.on_host`` is
told are not on the host (every path a device tensor takes, with values to check bit for bit),
and destinations on torch's ``meta`` device (a real other device: the final copies land there).
Processes run as threads over an in-process group that records every tensor posted to it, and
once as two spawned processes over a real gloo group (a FileStore in tmp_path).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from flowrl.backends.reshard import exchange, wire
from flowrl.backends.reshard.adapters import _flatten
from flowrl.backends.reshard.job import make_job
from flowrl.comm import JointSpec
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape
from flowrl_testing.reshard import expected_shard, synthetic_shard
from flowrl_testing.spawned import run_ranks
from flowrl_testing.thread_group import ThreadGroup

SHAPE = ModelShape(vocab_size=61, hidden_size=16, ffn_hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=4)
WIRE = torch.float32
TIMEOUT_S = 60.0
# (source (dp, tp, pp), destination (dp, tp, pp), placement, styles)
CASES = {
    "TP2 -> DP2 colocated": ((1, 2, 1), (2, 1, 1), "colocated", {}),
    "TP2 -> TP2 vllm split": ((1, 2, 1), (1, 2, 1), "split", {"dst_style": "vllm"}),
    "TP1 megatron -> TP1 hf split": ((1, 1, 1), (1, 1, 1), "split", {}),
}


def _job(case: str, transport: str = "planned", bucket: int | None = 512):
    src, dst, placement, styles = CASES[case]
    dims = lambda t: ParallelDims(dp=t[0], tp=t[1], pp=t[2])  # noqa: E731
    joint = JointSpec("unused", "", 0, dims(src).world_size + dims(dst).world_size) if placement == "split" else None
    return make_job(SHAPE, src=dims(src), dst=dims(dst), placement=placement, transport=transport,
                    bucket_bytes=bucket, wire_dtype="float32", make_vocab_size_divisible_by=4, joint=joint,
                    **styles)




def _shards(job, process, *, dst_device="cpu"):
    """(src_rank, dst_rank, src tensors, zeroed dst tensors) of ``process``."""
    src_spec, dst_spec = job.specs()
    placement = job.placement
    src_rank = placement.src.index(process) if process in placement.src else None
    dst_rank = placement.dst.index(process) if process in placement.dst else None
    src = synthetic_shard(src_spec, src_rank, WIRE) if src_rank is not None else None
    dst = None
    if dst_rank is not None:
        dst = {k: v.to(dst_device) for k, v in synthetic_shard(dst_spec, dst_rank, WIRE, fill=False).items()}
    return src_rank, dst_rank, src, dst


def _run_threads(job, *, dst_device="cpu", device: set[int] | None = None):
    """Every process of ``job`` in a thread: {process: (stats, its shards, its group)}; the
    storages of the source and destination tensors are added to ``device`` (when given)."""
    placement = job.placement
    procs = sorted(set(placement.src) | set(placement.dst))
    shards = {p: _shards(job, p, dst_device=dst_device) for p in procs}
    if device is not None:
        device.update(_storage(t) for *_, src, dst in shards.values() for d in (src, dst) for t in (d or {}).values())
    boxes: dict = {}
    groups = {p: ThreadGroup(p, boxes, timeout_s=TIMEOUT_S) for p in procs}

    def one(p):  # noqa: ANN001, ANN202
        src_rank, dst_rank, src, dst = shards[p]
        return exchange.run_rank(job, src_rank=src_rank, dst_rank=dst_rank, src=src, dst=dst, pg=groups[p])

    with ThreadPoolExecutor(len(procs)) as pool:
        futures = {p: pool.submit(one, p) for p in procs}
        stats = {p: f.result(timeout=TIMEOUT_S) for p, f in futures.items()}
    assert all(b.empty() for b in boxes.values())  # every message was received
    return {p: (stats[p], shards[p], groups[p]) for p in procs}


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _check_exact(job, results) -> None:
    dst_spec = job.specs()[1]
    for p, (_, (_, dst_rank, _, dst), _) in results.items():
        if dst_rank is not None:
            want = expected_shard(dst_spec, dst_rank, WIRE)
            for k in want:
                assert torch.equal(dst[k], want[k]), (p, k)


def test_host_tensors_are_not_copied_to_the_host():
    t = torch.arange(6.0)
    assert t.to("cpu") is t and t.to(wire.HOST) is t and t.to(WIRE).to(wire.HOST) is t
    assert wire.on_host(t) and not wire.on_host(torch.empty(2, device="meta"))
    staging = exchange.Staging()
    assert staging.alloc(4, WIRE).device == wire.HOST


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("transport", ["planned", "naive"])
def test_device_tensors_are_staged_in_host_memory(monkeypatch, case, transport):
    job = _job(case, transport)
    # the CPU path as it was: exact, and messages of whole contiguous slices use the tensors themselves
    on_cpu = _run_threads(job)
    _check_exact(job, on_cpu)
    own = {_storage(t) for _, (_, _, src, dst), _ in on_cpu.values() for t in [*(src or {}).values(), *(dst or {}).values()]}
    in_place = [t for *_, g in on_cpu.values() for *_, t in g.posted if _storage(t) in own]
    if transport == "planned":
        assert in_place, "no message went without staging on the CPU"

    # now every source and destination tensor is a "device" tensor
    device: set[int] = set()
    real_on_host = wire.on_host
    monkeypatch.setattr(wire, "on_host", lambda t: real_on_host(t) and _storage(t) not in device)
    staged = _run_threads(job, device=device)
    _check_exact(job, staged)  # the final copies landed in the "device" tensors
    posted = [(op, t) for *_, g in staged.values() for op, *_, t in g.posted]
    assert posted and all(t.device == wire.HOST and _storage(t) not in device for _, t in posted)
    peaks = {p: s["peak_extra_bytes"] for p, (s, _, _) in staged.items()}
    moved = {p: s["bytes_sent"] + s["bytes_received"] for p, (s, _, _) in staged.items()}
    assert all(peaks[p] > 0 for p in peaks if moved[p])  # what crossed was staged
    if transport == "planned":
        assert all(peaks[p] <= job.bucket_bytes for p in peaks)  # still within one bucket


@pytest.mark.parametrize("case", sorted(CASES))
def test_receive_buffers_are_host_and_the_copy_lands_on_the_destination_device(case):
    job = _job(case)
    results = _run_threads(job, dst_device="meta")
    for p, (stats, (_, dst_rank, _, dst), group) in results.items():
        assert all(t.device == wire.HOST for *_, t in group.posted)
        if dst_rank is not None:
            assert all(t.device.type == "meta" for t in dst.values())
            if stats["bytes_received"]:
                assert any(op == "recv" for op, *_ in group.posted)


def test_a_device_tensor_never_reaches_the_group(monkeypatch):
    class Refuse:
        def send(self, tensors, dst, tag):  # noqa: ANN001
            raise AssertionError("a tensor was posted")

        recv = send

    with pytest.raises(RuntimeError, match="must be staged in host memory"):
        wire.check_wire(torch.empty(2, device="meta"), "send")
    job = _job("TP1 megatron -> TP1 hf split")
    src = synthetic_shard(job.specs()[0], 0, WIRE)
    dst = synthetic_shard(job.specs()[1], 0, WIRE, fill=False)
    monkeypatch.setattr(wire, "on_host", lambda t: False)  # were a buffer not on the host...
    for kw in ({"src_rank": 0, "src": src}, {"dst_rank": 0, "dst": dst}):
        with pytest.raises(RuntimeError, match="must be staged in host memory"):  # ...it is refused unposted
            exchange.run_rank(job, pg=Refuse(), **kw)


def test_adapters_are_flattened_into_host_memory():
    layout = (("a", (2, 3)), ("b", (3,)))
    tensors = {"a": torch.arange(6.0).view(2, 3), "b": torch.ones(3)}
    flat = _flatten(layout, tensors, torch.bfloat16)
    assert flat.device == wire.HOST and flat.dtype == torch.bfloat16
    assert torch.equal(flat, torch.tensor([0, 1, 2, 3, 4, 5, 1, 1, 1], dtype=torch.bfloat16))


# --------------------------------------------------------------------------- real gloo, 2 processes
def _gloo_worker(rank: int, store_dir: str, out_path: str) -> None:
    """Both cases and transports, each as is and with every tensor a "device" one, over a world
    group of each backend string (GPU ranks get "cpu:gloo,cuda:nccl"; no NCCL here, so its
    stand-in is "cpu:gloo,cuda:gloo": the same two-backend group dispatching host tensors to gloo)
    and, split, over a gloo group of its own as ``flowrl.comm.joint`` makes."""
    from datetime import timedelta

    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = timedelta(seconds=TIMEOUT_S)
    device: set[int] = set()
    real_on_host = wire.on_host
    wire.on_host = lambda t: real_on_host(t) and _storage(t) not in device
    out = {}
    try:
        for world in ("gloo", "cpu:gloo,cuda:gloo"):
            store = dist.FileStore(f"{store_dir}/{world.replace(':', '_').replace(',', '_')}", 2)
            dist.init_process_group(world, store=store, rank=rank, world_size=2, timeout=timeout)
            joint = dist.ProcessGroupGloo(dist.PrefixStore("joint/", store), rank, 2, timeout)
            for case in ("TP2 -> DP2 colocated", "TP1 megatron -> TP1 hf split"):
                for transport in ("planned", "naive"):
                    for staged in (False, True):
                        job = _job(case, transport, bucket=256)
                        src_rank, dst_rank, src, dst = _shards(job, rank)
                        device.clear()
                        if staged:
                            device.update(_storage(t) for d in (src, dst) for t in (d or {}).values())
                        stats = exchange.run_rank(job, src_rank=src_rank, dst_rank=dst_rank, src=src, dst=dst,
                                                  pg=None if job.placement.kind == "colocated" else joint)
                        exact = True
                        if dst_rank is not None:
                            want = expected_shard(job.specs()[1], dst_rank, WIRE)
                            exact = all(torch.equal(dst[k], want[k]) for k in want)
                        out[f"{world}/{case}/{transport}/{'staged' if staged else 'cpu'}"] = {
                            "exact": exact, "sent": stats["bytes_sent"], "received": stats["bytes_received"],
                            "peak": stats["peak_extra_bytes"]}
            del joint
            dist.destroy_process_group()
    finally:
        wire.on_host = real_on_host
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(out, fh)


def test_bitwise_equal_weights_over_real_gloo_with_and_without_staging(tmp_path):
    codes = run_ranks(_gloo_worker, [(r, str(tmp_path), str(tmp_path / f"out{r}.json")) for r in range(2)],
                      timeout=180)
    assert codes == [0, 0]
    results = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(2)]
    assert len(results[0]) == 16
    for r in results:
        for key, row in r.items():
            assert row["exact"], (key, row)
    for key in results[0]:
        if key.endswith("/cpu"):
            staged = key[:-len("cpu")] + "staged"
            for r in results:  # the same bytes on the wire either way
                assert (r[key]["sent"], r[key]["received"]) == (r[staged]["sent"], r[staged]["received"])
                assert r[staged]["peak"] >= r[key]["peak"]
                assert r[staged]["peak"] > 0 or not r[key]["sent"] + r[key]["received"]  # device: staged

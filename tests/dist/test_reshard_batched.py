"""The batched round transport over real gloo (issues 28, 29): the wire a GPU run takes on NCCL
(each round one ``batch_isend_irecv`` in ``wire_plan.round_order``, tags unused), here with host
tensors on gloo, asked for explicitly. Four spawned processes run every case (tp/pp changes,
megatron <-> hf styles, vLLM's layout, colocated and split, many rounds and one) with both
transports through the host wire and the batched wire, in the same processes on the same shards:
the destination tensors are equal bit for bit (and to the synthetic model), and every process
reports the same bytes sent, received, copied and the same staging peak. A split case also runs
over a gloo group torch.distributed does not know (``flowrl.comm.joint``'s kind). No NCCL here.
"""

from __future__ import annotations

import json

import torch

from flowrl.backends.reshard.job import make_job
from flowrl.comm import JointSpec
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape
from flowrl_testing.reshard import expected_shard, synthetic_shard
from flowrl_testing.spawned import run_ranks

SHAPE = ModelShape(vocab_size=61, hidden_size=16, ffn_hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2,
                   head_dim=4)
WORLD = 4
WIRE = torch.float32
TIMEOUT_S = 60.0
KEYS = ("bytes_sent", "bytes_received", "bytes_local", "peak_extra_bytes", "bytes_min")
# name: (source (dp, tp, pp), destination (dp, tp, pp), placement, styles)
CASES = {
    "TP2xPP2 -> TP1xDP4": ((1, 2, 2), (4, 1, 1), "colocated", {}),
    "TP4 -> TP2xDP2 vllm": ((1, 4, 1), (2, 2, 1), "colocated", {"dst_style": "vllm"}),
    "TP2xPP2 -> TP2xDP2 vllm": ((1, 2, 2), (2, 2, 1), "colocated", {"dst_style": "vllm"}),
    "TP2xDP2 -> TP1xDP4": ((2, 2, 1), (4, 1, 1), "colocated", {}),
    "TP2 -> TP1xDP2 split": ((1, 2, 1), (2, 1, 1), "split", {}),
    "TP2 -> TP2 vllm split": ((1, 2, 1), (1, 2, 1), "split", {"dst_style": "vllm"}),
    "DP2 hf -> TP2 megatron split": ((2, 1, 1), (1, 2, 1), "split", {"src_style": "hf", "dst_style": "megatron"}),
}
BUCKETS = (512, None)  # dozens of rounds; one round with every pair at once
JOINT_CASE = "TP2 -> TP2 vllm split"


def _job(case: str, transport: str, bucket: int | None):
    src, dst, placement, styles = CASES[case]
    dims = lambda t: ParallelDims(dp=t[0], tp=t[1], pp=t[2])  # noqa: E731
    joint = JointSpec("unused", "", 0, WORLD) if placement == "split" else None
    return make_job(SHAPE, src=dims(src), dst=dims(dst), placement=placement, transport=transport,
                    bucket_bytes=bucket, wire_dtype="float32", make_vocab_size_divisible_by=4, joint=joint, **styles)


def _one(job, rank: int, pg, wire: str):
    """This process's run of ``job`` on ``wire``: (stats, destination tensors or None)."""
    from flowrl.backends.reshard.exchange import run_rank

    src_rank, dst_rank = job.placement.src_rank_at(rank), job.placement.dst_rank_at(rank)
    if src_rank is None and dst_rank is None:
        return None, None
    src_spec, dst_spec = job.specs()
    src = synthetic_shard(src_spec, src_rank, WIRE) if src_rank is not None else None
    dst = synthetic_shard(dst_spec, dst_rank, WIRE, fill=False) if dst_rank is not None else None
    return run_rank(job, src_rank=src_rank, dst_rank=dst_rank, src=src, dst=dst, pg=pg, wire=wire), dst


def _compare(job, rank: int, pg) -> dict:
    (host, host_dst), (batched, batched_dst) = (_one(job, rank, pg, w) for w in ("host", "batched"))
    if host is None:
        return {}
    row = {"host": {k: host[k] for k in (*KEYS, "wire")}, "batched": {k: batched[k] for k in (*KEYS, "wire")},
           "same": True, "exact": True}
    dst_rank = job.placement.dst_rank_at(rank)
    if dst_rank is not None:
        want = expected_shard(job.specs()[1], dst_rank, WIRE)
        row["same"] = all(torch.equal(host_dst[k], batched_dst[k]) for k in want)
        row["exact"] = all(torch.equal(batched_dst[k], want[k]) for k in want)
    return row


def _worker(rank: int, store_dir: str, out_path: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = timedelta(seconds=TIMEOUT_S)
    store = dist.FileStore(f"{store_dir}/store", WORLD)
    # a GPU rank's group string; no NCCL here, so cuda:gloo stands in (host tensors go to gloo)
    dist.init_process_group("cpu:gloo,cuda:gloo", store=store, rank=rank, world_size=WORLD, timeout=timeout)
    world = dist.distributed_c10d._get_default_group()
    out, batches = {}, {}
    real_batch = dist.batch_isend_irecv

    def counted(ops):  # the batches torch.distributed itself was handed
        batches[group] = batches.get(group, 0) + 1
        return real_batch(ops)

    dist.batch_isend_irecv = counted
    try:
        group = "world"
        for case in CASES:
            for transport in ("planned", "naive"):
                for bucket in BUCKETS:
                    out[f"{case}/{transport}/{bucket}/world"] = _compare(_job(case, transport, bucket), rank, world)
        group = "joint"
        joint = dist.ProcessGroupGloo(dist.PrefixStore("joint/", store), rank, WORLD, timeout)
        for transport in ("planned", "naive"):
            out[f"{JOINT_CASE}/{transport}/512/joint"] = _compare(_job(JOINT_CASE, transport, 512), rank, joint)
        del joint
        out["batches"] = batches
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(out, fh)


def test_batched_rounds_match_the_host_wire_over_real_gloo(tmp_path):
    codes = run_ranks(_worker, [(r, str(tmp_path), str(tmp_path / f"out{r}.json")) for r in range(WORLD)],
                      timeout=240)
    assert codes == [0] * WORLD
    results = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(WORLD)]
    runs = len(CASES) * 2 * len(BUCKETS) + 2
    batches = [r.pop("batches") for r in results]
    assert all(len(r) == runs for r in results)
    # the world group took every batched round as one batch_isend_irecv; the joint group, which
    # torch.distributed does not know, had its ops posted one by one (and never a host wire's tag)
    assert all(b.get("world", 0) > 0 and "joint" not in b for b in batches), batches
    for rank, rows in enumerate(results):
        for key, row in rows.items():
            if not row:  # this process takes no part in the case
                continue
            assert row["exact"] and row["same"], (rank, key)
            assert row["host"]["wire"] == "host" and row["batched"]["wire"] == "batched", (rank, key)
            host, batched = ({k: row[w][k] for k in KEYS} for w in ("host", "batched"))
            assert host == batched, (rank, key, host, batched)  # bytes sent/received/copied, staging peak
    for key in results[0]:  # every case moved something, and what was sent was received
        rows = [r[key] for r in results if r[key]]
        sent = sum(row["batched"]["bytes_sent"] for row in rows)
        assert sent > 0 and sent == sum(row["batched"]["bytes_received"] for row in rows), key

"""Run reshard transports on synthetic shards in spawned gloo processes (benchmark and tests).

Every element of the synthetic model is a pure function of (parameter index, flat HF index): a
small integer, exact in fp32 and bf16. So each process builds only its own source shard (no full
model anywhere), and after a reshard every destination element is checked bit for bit against the
same function, padding rows against zero.

``run_cases(world_size, model, cases, ...)`` spawns ``world_size`` processes in one gloo world and
runs each case (a source layout, a destination layout, colocated or split placement) with each
transport ``repeats`` times; it returns one record per (case, transport) with bytes moved, the
plan's minimum, staging peaks per process, wall times and whether every shard was exact.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

from flowrl.backends.interfaces import torch_dtype
from flowrl.backends.reshard.job import ReshardJob, make_job
from flowrl.comm import JointSpec, free_port
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape, ShardSpec

__all__ = ["expected_shard", "run_cases", "synthetic_shard"]

def _values(param_index: int, shape: tuple[int, ...], dim: int, start: int, stop: int,
            dtype: torch.dtype) -> torch.Tensor:
    """HF elements [start, stop) along ``dim`` of parameter ``param_index``: (7*flat + 13*p) % 251."""
    if len(shape) == 1 or dim == 0:
        cols = 1 if len(shape) == 1 else shape[1]
        flat = torch.arange(start * cols, stop * cols, dtype=torch.int64)
        flat = flat.view(stop - start, *shape[1:])
    else:
        flat = (torch.arange(shape[0], dtype=torch.int64)[:, None] * shape[1]
                + torch.arange(start, stop, dtype=torch.int64)[None, :])
    return ((flat * 7 + 13 * param_index) % 251).to(dtype)


def synthetic_shard(spec: ShardSpec, rank: int, dtype: torch.dtype, *, fill: bool = True
                    ) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s local tensors of the synthetic model (zeros when ``fill`` is False)."""
    index = {name: i for i, name in enumerate(spec.params)}
    shard = spec.shard_of(rank)
    out = {name: torch.zeros(shape, dtype=dtype) for name, shape in shard.tensors.items()}
    if fill:
        for piece in shard.pieces:
            values = _values(index[piece.param], spec.params[piece.param], piece.dim, piece.start,
                             piece.stop, dtype)
            local = out[piece.local] if piece.index is None else out[piece.local][piece.index]
            local.narrow(piece.dim, piece.offset, piece.length).copy_(values)  # index: one expert
    return out


def expected_shard(spec: ShardSpec, rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return synthetic_shard(spec, rank, dtype, fill=True)


def _job(model: ModelShape, case: dict, transport: str, bucket_bytes: int | None,
         dtype: str) -> ReshardJob:
    return make_job(model, src=ParallelDims(**case["src"]), dst=ParallelDims(**case["dst"]),
                    placement=case["placement"], src_style=case.get("src_style", "megatron"),
                    dst_style=case.get("dst_style", "hf"), transport=transport,
                    bucket_bytes=bucket_bytes, wire_dtype=dtype,
                    joint=None if case["placement"] == "colocated" else _NO_RENDEZVOUS)


# Split cases run in one spawned world and pass its default group (ranks = processes) to
# run_rank, so the joint group's rendezvous is never used.
_NO_RENDEZVOUS = JointSpec("unused", "", 0, 1)


def _worker(rank: int, world_size: int, port: int, model_kwargs: dict, cases: list[dict],
            transports: list[str], bucket_bytes: int | None, dtype: str, repeats: int,
            out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    pg = dist.distributed_c10d._get_default_group()
    model = ModelShape(**model_kwargs)
    wire = torch_dtype(dtype)
    records = []
    try:
        for case in cases:
            jobs = {t: _job(model, case, t, bucket_bytes, dtype) for t in transports}
            plan = jobs[transports[0]].plan()
            placement = plan.placement
            src_rank = placement.src.index(rank) if rank in placement.src else None
            dst_rank = placement.dst.index(rank) if rank in placement.dst else None
            src = synthetic_shard(plan.src, src_rank, wire) if src_rank is not None else None
            for job in jobs.values():
                job.schedule()  # planning is not timed (it is cached per job in a run)
            walls = {t: [] for t in transports}
            stats: dict[str, dict] = {}
            exact = dict.fromkeys(transports, True)
            # transports alternate within each repeat, so load from elsewhere hits them alike
            for repeat in range(repeats):
                for transport, job in jobs.items():
                    dst = (synthetic_shard(plan.dst, dst_rank, wire, fill=False)
                           if dst_rank is not None else None)
                    dist.barrier()
                    start = time.perf_counter()
                    stats[transport] = _run(job, rank, src_rank, dst_rank, src, dst, pg)
                    dist.barrier()
                    walls[transport].append(time.perf_counter() - start)
                    if dst is not None and repeat == 0:  # checked once: it is deterministic
                        want = expected_shard(plan.dst, dst_rank, wire)
                        exact[transport] = all(torch.equal(dst[k], want[k]) for k in want)
                        del want
                    del dst
            for transport, job in jobs.items():
                gathered = [None] * world_size
                dist.all_gather_object(gathered, {**stats[transport], "exact": exact[transport],
                                                  "rank": rank})
                if rank == 0:
                    records.append(_record(case, transport, job, gathered, walls[transport]))
            if rank == 0:
                print(f"reshard case {case['name']!r} done", flush=True)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out_path, "w", encoding="utf-8") as fh:
            json.dump(records, fh)


def _run(job: ReshardJob, rank: int, src_rank: int | None, dst_rank: int | None, src: Any,
         dst: Any, pg: Any) -> dict:
    from flowrl.backends.reshard.exchange import run_rank

    if src_rank is None and dst_rank is None:  # this process takes no part in the case
        return {"bytes_sent": 0, "bytes_received": 0, "bytes_local": 0, "peak_extra_bytes": 0,
                "seconds": 0.0}
    return run_rank(job, src_rank=src_rank, dst_rank=dst_rank, src=src, dst=dst, pg=pg)


def _record(case: dict, transport: str, job: ReshardJob, per_rank: list[dict],
            walls: list[float]) -> dict:
    plan = job.plan()
    dst_share = plan.model_bytes / (plan.dst.dims.tp * plan.dst.dims.pp)
    return {
        "case": case["name"], "placement": plan.placement.kind, "transport": transport,
        "src": str(plan.src.dims), "dst": str(plan.dst.dims),
        "model_bytes": plan.model_bytes, "bucket_bytes": job.bucket_bytes,
        "bytes_moved": sum(r["bytes_received"] for r in per_rank),
        "bytes_min": plan.bytes_min,
        "peak_extra_bytes": [r["peak_extra_bytes"] for r in per_rank],
        "peak_bound_bytes": dst_share + (job.bucket_bytes or 0),
        "wall_s": walls, "wall_s_median": statistics.median(walls),
        "exact": all(r["exact"] for r in per_rank),
    }


def run_cases(world_size: int, model: ModelShape, cases: list[dict], *,
              transports: tuple[str, ...] = ("planned", "naive"), bucket_bytes: int | None = 1 << 20,
              dtype: str = "float32", repeats: int = 3, timeout_s: float = 600) -> list[dict]:
    """Spawn ``world_size`` gloo processes and run every case with every transport (see the
    module doc). ``cases``: dicts with ``name``, ``src``/``dst`` (ParallelDims kwargs),
    ``placement`` ("colocated" or "split") and optional ``src_style``/``dst_style``."""
    import dataclasses

    import torch.multiprocessing as mp

    for case in cases:  # fail here, before any process starts, on a layout that can't work
        _job(model, case, "planned", bucket_bytes, dtype).plan()
        need = max(ParallelDims(**case["src"]).world_size + (
            ParallelDims(**case["dst"]).world_size if case["placement"] == "split" else 0), 1)
        if need > world_size:
            raise ValueError(f"case {case['name']!r} needs {need} processes, the run has "
                             f"{world_size}")
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "records.json")
        args = (world_size, free_port(), dataclasses.asdict(model), cases, list(transports),
                bucket_bytes, dtype, repeats, out_path)
        ctx = mp.start_processes(_worker, args=args, nprocs=world_size, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=5.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reshard cases did not finish within {timeout_s:.0f}s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
        with open(out_path, encoding="utf-8") as fh:
            return json.load(fh)

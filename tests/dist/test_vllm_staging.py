"""The vllm rollout's reshard staging over gloo: the tp ranks of each replica send their staged
shards to the replica's engine rank, which assembles the full HF-named state (dp=2, tp=2)."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flowrl.backends.generate.staging import gather_replica_state
from flowrl.comm import free_port
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import ModelShape, shard_arrays, shard_spec

DP, TP = 2, 2
MODEL = ModelShape(vocab_size=99, hidden_size=32, ffn_hidden_size=64, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=8, qkv_bias=True, tied_embeddings=True)


def _full_state(spec):
    gen = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=gen) for name, shape in spec.params.items()}


def _rank(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=DP * TP)
    try:
        spec = shard_spec(MODEL, ParallelDims(dp=DP, tp=TP, pp=1), style="vllm")
        shard = spec.shard_of(rank)
        local = shard_arrays(spec, _full_state(spec), (shard.tp_rank, shard.pp_rank))  # what the reshard wrote
        state = gather_replica_state(spec, rank, TP, local)
        results[rank] = None if state is None else {k: v.clone() for k, v in state.items()}
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_each_replica_engine_rank_gets_the_full_state():
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        port = free_port()
        procs = [ctx.Process(target=_rank, args=(r, port, results)) for r in range(DP * TP)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=100)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        got = dict(results)
    spec = shard_spec(MODEL, ParallelDims(dp=DP, tp=TP, pp=1), style="vllm")
    full = _full_state(spec)
    assert got[1] is None and got[3] is None  # tp rank 1 of each replica holds no engine
    for engine_rank in (0, 2):
        assert got[engine_rank].keys() == full.keys()
        for name in full:
            torch.testing.assert_close(got[engine_rank][name], full[name], rtol=0, atol=0)

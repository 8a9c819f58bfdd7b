"""Spawned ranks of the distributed-optimizer checkpoint test (tests/dist/test_megatron_checkpoint.py).

``resume_worker`` (2 ranks, gloo): an uninterrupted run trains two steps at tp1 dp2 with megatron's
distributed optimizer and saves after the first; then each target layout loads that checkpoint,
saves it again right away (a checkpoint of its own layout) and takes the second step. Rank 0
writes, per target, the second step's loss and the largest parameter difference from the
uninterrupted run, and whether the re-saved checkpoint equals the original bitwise.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.distributed as dist

from flowrl_testing.megatron import HYPERS, init_process_group, make_batch, pg_loss_fn

SOURCE = {"tp": 1, "pp": 1, "dp": 2, "use_distributed_optimizer": True}
TARGETS = {
    "tp1-dp2-distopt": SOURCE,
    "tp2-dp1-distopt": {"tp": 2, "pp": 1, "dp": 1, "use_distributed_optimizer": True},
    "pp2-dp1": {"tp": 1, "pp": 2, "dp": 1},
    "tp1-dp2": {"tp": 1, "pp": 1, "dp": 2},
}


def _step(engine, batch: list[dict]) -> float:
    """One train step on this rank's dp share; the loss summed over the global batch."""
    from megatron.core import parallel_state as ps

    n = len(batch) // engine.dp
    share = batch[ps.get_data_parallel_rank() * n:(ps.get_data_parallel_rank() + 1) * n]
    total = sum(len(it["response_ids"]) for it in batch)
    return engine.train_step(share, micro_batch_size=2, loss_fn=pg_loss_fn(total))["loss"]


def _split_somewhere(engine) -> bool:
    """Some parameter's distributed-optimizer state is split between dp ranks (a cut chunk)."""
    from flowrl.backends.train.megatron.checkpoint import _local_params
    from flowrl.backends.train.megatron.dist_optim import distributed_optimizers, local_ranges

    params = _local_params(engine)
    ranges = local_ranges(distributed_optimizers(engine.optimizer), params)
    split = any(0 < e - s < params[n].numel() for n, (s, e) in ranges.items())
    flag = torch.tensor([float(split)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag)


def _same(a: str, b: str) -> bool:
    from flowrl.checkpoint import load_full, load_meta

    if sorted(load_meta(a)["optim"]) != sorted(load_meta(b)["optim"]):
        return False
    for state in (None, "exp_avg", "exp_avg_sq"):
        x, y = load_full(a, state=state, as_torch=True), load_full(b, state=state, as_torch=True)
        if x.keys() != y.keys() or not all(torch.equal(x[n], y[n]) for n in x):
            return False
    return True


def resume_worker(rank: int, port: int, model_dir: str, root: str, out_path: str) -> None:
    from flowrl.backends.train.megatron.checkpoint import load_sharded, save_sharded
    from flowrl.backends.train.megatron.engine import MegatronEngine

    init_process_group(rank, 2, port)
    vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    first, second = make_batch(num_items=8, vocab_size=vocab, seed=1), make_batch(num_items=8, vocab_size=vocab, seed=2)
    saved = os.path.join(root, "source")
    engine = MegatronEngine(model_dir, **SOURCE, **HYPERS)
    out: dict[str, Any] = {"split": _split_somewhere(engine), "first_loss": _step(engine, first)}
    saved_info = save_sharded(engine, saved, step=1)
    out["saved_optim_step"] = saved_info["optim_step"] if rank == 0 else None
    out["loss"] = _step(engine, second)
    want = engine.hf_state_dict()
    engine.close()
    for name, layout in TARGETS.items():
        engine = MegatronEngine(model_dir, **layout, **HYPERS)
        restored = load_sharded(engine, saved)
        again = save_sharded(engine, os.path.join(root, name), step=1)
        loss = _step(engine, second)
        got = engine.hf_state_dict()
        engine.close()
        if rank == 0:
            out[name] = {"optim_step": restored, "resaved_bitwise": _same(saved, again["path"]),
                         "loss": loss, "max_param_diff": max(float((got[k] - want[k]).abs().max()) for k in want),
                         "bitwise_params": all(torch.equal(got[k], want[k]) for k in want)}
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(out, fh)
    dist.destroy_process_group()

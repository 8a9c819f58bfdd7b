"""Spawned ranks of the MoE checkpoint test (tests/dist/test_megatron_moe_checkpoint.py).

``resume_worker`` (4 ranks, gloo): the tiny Qwen3-MoE trains one step at EP 2 x TP 2 (dp 2, etp
2) and saves (each shard key's first rank writes); EP 1 x DP 4 loads that checkpoint and saves it
again right away, as does EP 2 x PP 2 (etp 1) from the EP 1 x DP 4 one. Rank 0 writes whether
each re-saved checkpoint equals the original bitwise (parameters, exp_avg, exp_avg_sq), the
optimizer step restored, and how many expert tensors carry a non-zero optimizer state.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.distributed as dist

from flowrl_testing.megatron import HYPERS, init_process_group, make_batch, pg_loss_fn
from flowrl_testing.megatron_checkpoint import _same

SOURCE = {"tp": 2, "pp": 1, "dp": 2, "ep": 2}
TARGETS = {"ep1-dp4": {"tp": 1, "pp": 1, "dp": 4, "ep": 1},
           "ep2-pp2-etp1": {"tp": 1, "pp": 2, "dp": 2, "ep": 2, "etp": 1}}


def _step(engine, batch: list[dict]) -> float:
    from megatron.core import parallel_state as ps

    n = len(batch) // engine.dp
    share = batch[ps.get_data_parallel_rank() * n:(ps.get_data_parallel_rank() + 1) * n]
    total = sum(len(it["response_ids"]) for it in batch)
    return engine.train_step(share, micro_batch_size=2, loss_fn=pg_loss_fn(total))["loss"]


def resume_worker(rank: int, port: int, model_dir: str, root: str, out_path: str) -> None:
    from flowrl.backends.train.megatron.checkpoint import load_sharded, save_sharded
    from flowrl.backends.train.megatron.engine import MegatronEngine
    from flowrl.checkpoint import load_full

    init_process_group(rank, 4, port)
    vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    engine = MegatronEngine(model_dir, **SOURCE, **HYPERS)
    _step(engine, make_batch(num_items=8, vocab_size=vocab, seed=1))
    source = os.path.join(root, "source")
    info = save_sharded(engine, source, step=1)
    engine.close()
    out: dict[str, Any] = {}
    previous = source
    for name, layout in TARGETS.items():
        engine = MegatronEngine(model_dir, **layout, **HYPERS)
        restored = load_sharded(engine, previous)
        again = save_sharded(engine, os.path.join(root, name), step=1)
        engine.close()
        dist.barrier()
        if rank == 0:
            out[name] = {"optim_step": restored, "resaved_bitwise": _same(source, again["path"])}
            previous = again["path"]
        box = [previous]
        dist.broadcast_object_list(box, src=0)
        previous = box[0]
    if rank == 0:
        exp_avg = load_full(source, state="exp_avg", as_torch=True)
        out["saved_optim_step"] = info["optim_step"]
        out["experts_with_state"] = sum(bool(t.abs().sum() > 0) for n, t in exp_avg.items()
                                        if ".mlp.experts." in n)
        out["expert_tensors"] = sum(".mlp.experts." in n for n in exp_avg)
        with open(out_path, "w") as fh:
            json.dump(out, fh)
    dist.destroy_process_group()

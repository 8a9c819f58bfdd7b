"""Helpers for the megatron critic's parity test (``tests/dist/test_megatron_critic.py``): a batch
table, the dp critic's reference numbers (single process) and a spawned rank that runs the same
:class:`~flowrl.roles.critic.CriticRole` calls with ``critic.strategy=megatron`` per layout.

Both sides run the role's own ``compute_values`` and ``update`` (clipped value loss, global
token-mean denominator, AdamW), so the comparison covers the role, the adapter and the engine.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa
import torch
import torch.distributed as dist

from flowrl_testing.megatron import init_process_group

# weight_decay 0: torch's AdamW (dp critic) decays norms and biases, megatron's does not.
OPTIM = dict(lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-6, grad_clip=0.5)
CLIPRANGE_VALUE = 0.05
NUM_ROWS = 6


def critic_config(*, strategy: str, dp: int = 1, tp: int = 1, pp: int = 1):
    from flowrl.config import CriticConfig, OptimConfig

    return CriticConfig(strategy=strategy, data_parallel_size=dp, tensor_model_parallel_size=tp,
                        pipeline_model_parallel_size=pp, optim=OptimConfig(**OPTIM),
                        ppo_micro_batch_size_per_gpu=2, forward_micro_batch_size_per_gpu=2,
                        cliprange_value=CLIPRANGE_VALUE)


def make_table(vocab_size: int, *, seed: int = 3) -> pa.Table:
    """Rows of varied prompt / response lengths, some response tokens masked."""
    from flowrl.data import experience as ex

    g = torch.Generator().manual_seed(seed)
    prompts, responses, masks = [], [], []
    for i in range(NUM_ROWS):
        p, r = 1 + (3 * i) % 4, 1 + (5 * i + 2) % 5
        prompts.append(torch.randint(0, vocab_size, (p,), generator=g).tolist())
        responses.append(torch.randint(0, vocab_size, (r,), generator=g).tolist())
        masks.append([int(j < r - (i % 2)) or int(j == 0) for j in range(r)])
    return pa.table({"prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
                     "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
                     "response_mask": ex.from_lists(masks, pa.list_(pa.int8()))})


def with_targets(table: pa.Table, values: pa.ChunkedArray, *, seed: int = 4) -> pa.Table:
    """Add ``values`` (the old values: the computed ones, shifted so value clipping engages on some
    tokens) and random ``returns``."""
    from flowrl.data import experience as ex

    g = torch.Generator().manual_seed(seed)
    values_T, cu = ex.token_column(pa.table({"values": values}), "values")
    old_T = values_T + 0.1 * torch.randn(values_T.shape, generator=g)
    returns_T = torch.randn(values_T.shape, generator=g)
    return ex.with_columns(table, values=ex.list_column(old_T, cu, ex.TOKEN_FLOATS),
                           returns=ex.list_column(returns_T, cu, ex.TOKEN_FLOATS))


def dp_reference(model_dir: str, vocab_size: int) -> dict[str, Any]:
    """The dp critic (one process): values, then one update's metrics and its HF state."""
    from flowrl.data import experience as ex
    from flowrl.roles.critic import CriticRole

    table = make_table(vocab_size)
    role = CriticRole(rank=0, world_size=1, model_dir=model_dir,
                      critic=critic_config(strategy="dp"), response_length=5)
    values = role.compute_values(table).column("values")
    state0_score = role.engine.hf_state_dict()["score.weight"]
    train_table = with_targets(table, values)
    metrics = role.update(train_table, mini_batch_rows=NUM_ROWS)
    return {"values": ex.token_column(pa.table({"values": values}), "values")[0],
            "metrics": metrics, "state": role.engine.hf_state_dict(), "train_table": train_table,
            "state0_score": state0_score}


def _gather_rows(values_T: torch.Tensor, dp_rank: int, dp: int) -> torch.Tensor | None:
    shares = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object((dp_rank, values_T), shares, dst=0)
    if dist.get_rank() != 0:
        return None
    by_dp = dict(shares)  # tp / pp peers of a dp rank return the same share
    return torch.cat([by_dp[d] for d in range(dp)])


def check_critic_layout(model_dir: str, ref: dict, *, dp: int, tp: int, pp: int) -> dict[str, Any]:
    """One layout: the megatron critic's values and post-update state vs the dp critic's."""
    from megatron.core import parallel_state as ps

    from flowrl.data import experience as ex
    from flowrl.roles.critic import CriticRole

    role = CriticRole(rank=dist.get_rank(), world_size=dist.get_world_size(), model_dir=model_dir,
                      critic=critic_config(strategy="megatron", dp=dp, tp=tp, pp=pp),
                      response_length=5)
    dp_rank = ps.get_data_parallel_rank()
    train_share = ex.split(ref["train_table"], dp)[dp_rank]
    values_T, _ = ex.token_column(role.compute_values(train_share.select(
        ["prompt_ids", "response_ids", "response_mask"])), "values")
    gathered = _gather_rows(values_T, dp_rank, dp)
    metrics = role.update(train_share, mini_batch_rows=NUM_ROWS // dp)
    state = role.engine.hf_state_dict()
    result: dict[str, Any] = {}
    if dist.get_rank() == 0:
        result["values"] = float((gathered - ref["values"]).abs().max())
        assert set(state) == set(ref["state"]), set(state) ^ set(ref["state"])
        result["state"] = max(float((state[k] - v).abs().max()) for k, v in ref["state"].items())
        result["head_moved"] = float((state["score.weight"] - ref["state0_score"]).abs().max())
        result["grad_norm"] = abs(metrics["critic/grad_norm"] - ref["metrics"]["critic/grad_norm"])
        result["metrics"] = sorted(metrics)
    role.close()
    return result


def critic_layouts_worker(rank: int, world_size: int, port: int, ref_path: str, model_dir: str,
                          layouts: list[tuple[int, int, int]], out_path: str) -> None:
    """Spawned rank: ``check_critic_layout`` for each layout in turn; rank 0 writes JSON."""
    init_process_group(rank, world_size, port)
    ref = torch.load(ref_path, weights_only=False)
    results = []
    for dp, tp, pp in layouts:
        start = time.monotonic()
        result = check_critic_layout(model_dir, ref, dp=dp, tp=tp, pp=pp)
        results.append({"layout": [dp, tp, pp], **result, "seconds": time.monotonic() - start})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def critic_checkpoint_round(rank: int, world: int, model_dir: str, vocab_size: int, path: str, tp: int,
                            pp: int) -> dict[str, Any]:
    """The megatron critic at (dp, tp, pp) = (world / tp / pp, tp, pp): one update, a checkpoint at
    ``path`` (the head whole, ``score.*``), its values; a fresh critic loads it: its values, and the
    next update's stats (AdamW's state restored)."""
    from megatron.core import parallel_state as ps

    from flowrl.data import experience as ex
    from flowrl.roles.critic import CriticRole

    dp = world // (tp * pp)
    cfg = critic_config(strategy="megatron", dp=dp, tp=tp, pp=pp)

    def role() -> CriticRole:
        return CriticRole(rank=rank, world_size=world, model_dir=model_dir, critic=cfg, response_length=5)

    table = make_table(vocab_size)
    first = role()
    train = with_targets(table, first.compute_values(table).column("values"))
    share = ex.split(train, dp)[ps.get_data_parallel_rank()]
    first.update(share, mini_batch_rows=NUM_ROWS // dp)
    saved = first.save_checkpoint(path, step=1, extra={"next_step": 1})
    values = ex.token_column(first.compute_values(table), "values")[0]
    first.close()
    second = role()
    optim_step = second.load_checkpoint(saved["path"] if saved else path)
    loaded = ex.token_column(second.compute_values(table), "values")[0]
    share = ex.split(train, dp)[ps.get_data_parallel_rank()]
    metrics = second.update(share, mini_batch_rows=NUM_ROWS // dp)
    second.close()
    return {"saved": saved, "values": values, "loaded": loaded, "optim_step": optim_step, "train": train,
            "next": {k: metrics[k] for k in ("critic/vf_loss", "critic/grad_norm")}}

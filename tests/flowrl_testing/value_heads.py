"""Multi-process helpers for the value and reward heads' parity: a freshly built critic or reward
model at any train strategy and layout, its values on a fixed batch (and how it loaded)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

VALUE, REWARD = "value", "reward"


def _dp_engine(kind: str, strategy: str) -> Any:
    from flowrl.registry import import_string

    return import_string({
        (VALUE, "dp"): "flowrl.backends.train.dp_value:TorchDPValueEngine",
        (VALUE, "fsdp"): "flowrl.backends.train.fsdp_value:FSDPValueEngine",
        (VALUE, "megatron"): "flowrl.backends.train.megatron.value:MegatronValueTrainEngine",
        (REWARD, "dp"): "flowrl.backends.train.dp_reward:TorchDPRewardEngine",
        (REWARD, "fsdp"): "flowrl.backends.train.fsdp_reward:FSDPRewardEngine",
        (REWARD, "megatron"): "flowrl.backends.train.megatron.reward:MegatronRewardTrainEngine",
    }[(kind, strategy)])


def initial_values(rank: int, world: int, model_dir: str, kind: str, strategy: str, table: pa.Table, seed: int,
                   tp: int = 1) -> dict:
    """A new ``kind`` model of ``seed`` at ``strategy``: the values of every row of ``table`` (each
    rank scores the whole table), ``meta`` whether FSDP built it on the meta device, ``bytes_read``
    the checkpoint bytes a megatron rank read (its shard only)."""
    from flowrl.data.packed import PackedBatch

    cls = _dp_engine(kind, strategy)
    extra = {"tp": tp, "pp": 1, "dp": world // tp} if strategy == "megatron" else {}
    out: dict[str, Any] = {}
    if strategy == "fsdp":
        from flowrl.backends.train.fsdp_value import classifier_on_meta
        import torch

        out["meta"] = classifier_on_meta(cls, model_dir, torch.float32) is not None
    engine = cls(model_dir, lr=1e-3, seed=seed, **extra)
    out["values"] = engine.forward_values(PackedBatch.from_table(table), micro_batch_size=4)
    if strategy == "megatron":
        out["bytes_read"] = engine.engine.checkpoint_bytes_read
    engine.close() if hasattr(engine, "close") else None
    return out

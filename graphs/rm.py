"""Reward-model training (Bradley-Terry): one iteration as a Dask graph.

    pairs  = a batch of (chosen, rejected) pairs, adjacent rows         (client, this step's table)
    stats  = -logsigmoid(r_chosen - r_rejected), a scalar head  on actor  (flowrl.algos.rm_loss)
    return pairs, stats

The ``actor`` group holds the reward model (``flowrl.roles.reward_trainer``: the causal LM of
``model.path`` with a one-output sequence-classification head, scored at the last token), so
checkpoints, resume and ``flowrl export-hf`` work as for a policy; the exported directory is a
``reward_model.model_path`` for RL. Data: the pair Parquet of the ``dpo`` family
(``flowrl.data.pairs``). Validation: the held-out pair accuracy (``val-core/rm/accuracy``).
Backends: ``actor.strategy`` dp, fsdp or megatron (tp x pp; its checkpoints hold the head under
the dp model's name, so any of them resumes or exports any other's), and LoRA (``model.lora_rank`` > 0 on dp or fsdp: adapters on the
backbone, the ``score`` head trained whole; ``flowrl export-hf --merge-lora``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.actors.group import BoundCall
from flowrl.backends.train.reward import REWARD_ENGINES, reward_engine
from flowrl.catalog.backends import TRAIN_BACKENDS, ShardStyle
from flowrl.config import ConfigError, RunConfig
from flowrl.graphs import post_training as pt
from flowrl.metrics import names
from flowrl.graphs.family import BuildContext, Family, IterationGraph, register_family
from flowrl.nodes import NodeOut, node


def train_pairs(actor: BoundCall, table: pa.Table, mini_batch_rows: int) -> NodeOut:
    metrics, compute_s = actor.run("train_pairs", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.OUTPUT,
                                   kwargs={"mini_batch_rows": mini_batch_rows})
    return NodeOut(metrics, {**metrics, names.compute("update_actor"): compute_s})


def pair_accuracy(actor: BoundCall, table: pa.Table) -> NodeOut:
    """``val-core/rm/accuracy`` (chosen scored above rejected) and the mean margin of ``table``'s pairs."""
    scores, _ = actor.run("compute_rm_scores", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT)
    s = scores.column("rm_score").to_numpy()
    return NodeOut(None, {f"{pt.VALIDATION}rm/accuracy": float(np.mean(s[0::2] > s[1::2])),
                          f"{pt.VALIDATION}rm/margin": float(np.mean(s[0::2] - s[1::2]))})


def _check_megatron(cfg: RunConfig) -> None:
    """What the megatron reward engine (``flowrl.backends.train.megatron.reward``) does not do:
    interleaved pipelines, offloading between phases."""
    from flowrl.backends.train.megatron.options import OFFLOAD_KEYS

    a = cfg.actor
    if a.virtual_pipeline_model_parallel_size > 1:
        raise ConfigError("actor.virtual_pipeline_model_parallel_size", a.virtual_pipeline_model_parallel_size,
                          "the megatron reward model has no interleaved pipeline (as the megatron critic)", "set it to 1")
    for key in OFFLOAD_KEYS:
        if getattr(a.megatron, key):
            raise ConfigError(f"actor.megatron.{key}", True, "the rm family never generates: nothing to offload "
                              "between phases", f"set actor.megatron.{key}=false")


@register_family("rm")
class RewardModel(Family):
    """A Bradley-Terry reward model on preference pairs; no generation, no reference."""

    pairs = True

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        pt.check_layout(cfg, self.name, pairs=True)
        a = cfg.actor
        try:
            reward_engine(a.strategy)
        except ValueError:
            raise ConfigError("actor.strategy", a.strategy, "has no reward-model engine yet (the rm family)",
                              f"use one of {', '.join(REWARD_ENGINES)}") from None
        if TRAIN_BACKENDS.spec(a.strategy).shard_style is ShardStyle.MEGATRON:
            _check_megatron(cfg)

    def group_specs(self) -> list[Any]:
        from flowrl.actors import GroupMesh
        from flowrl.actors.session import GroupSpec
        from flowrl.roles.specs import lora_engine_kwargs

        c, a = self.cfg, self.cfg.actor
        return [GroupSpec("actor", "flowrl.roles.reward_trainer:RewardTrainerRole",
                          {"model_dir": c.model.path, "actor": a, "dtype": c.model.dtype, "seed": c.trainer.seed,
                           "total_steps": c.trainer.total_training_steps, **lora_engine_kwargs(c.model)},
                          GroupMesh(dp=a.data_parallel_size, tp=a.tensor_model_parallel_size,
                                    pp=a.pipeline_model_parallel_size))]

    @classmethod
    def load_data(cls, cfg: RunConfig, tokenizer: Any, which: str = "train") -> Any:
        from flowrl.data.pairs import PairDataset

        return PairDataset(pt.data_files(cfg, which), tokenizer, prompt_key=cfg.data.prompt_key,
                           max_length=cfg.algorithm.sft.max_length, truncation=cfg.data.truncation)

    def build(self, ctx: BuildContext, prompts: pa.Table, *, step: int, collected: NodeOut | None = None) -> IterationGraph:
        stats = node("update_actor", train_pairs, ctx.groups["actor"].bind(), prompts,
                     pt.mini_batch_rows(self.cfg, pairs=True), step=step)
        return IterationGraph(result=node("collect", pt.result, prompts, stats, step=step),
                              sync=node("sync", pt.no_sync, stats, step=step))

    def validation(self, ctx: BuildContext, table: pa.Table, *, step: int) -> Any:
        return node("validate", pair_accuracy, ctx.groups["actor"].bind(), table, step=step)

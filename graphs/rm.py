"""Reward-model training (Bradley-Terry): one iteration as a Dask graph.

    pairs  = a batch of (chosen, rejected) pairs, adjacent rows         (client, this step's table)
    stats  = -logsigmoid(r_chosen - r_rejected), a scalar head  on actor  (flowrl.algos.rm_loss)
    return pairs, stats

The ``actor`` group holds the reward model (``flowrl.roles.reward_trainer``: the causal LM of
``model.path`` with a one-output sequence-classification head, scored at the last token), so
checkpoints, resume and ``flowrl export-hf`` work as for a policy; the exported directory is a
``reward_model.model_path`` for RL. Data: the pair Parquet of the ``dpo`` family
(``flowrl.data.pairs``). Validation: the held-out pair accuracy (``val-core/rm/accuracy``).
Backends: ``actor.strategy`` dp or fsdp (no megatron or LoRA reward-model engine yet).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.actors.group import BoundCall
from flowrl.backends.train.reward import REWARD_ENGINES, reward_engine
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
        if cfg.model.lora_rank:
            raise ConfigError("model.lora_rank", cfg.model.lora_rank, "the rm family trains every weight of its "
                              "sequence-classification model (no LoRA reward model yet)", "set model.lora_rank=0")

    def group_specs(self) -> list[Any]:
        from flowrl.actors import GroupMesh
        from flowrl.actors.session import GroupSpec

        c, a = self.cfg, self.cfg.actor
        return [GroupSpec("actor", "flowrl.roles.reward_trainer:RewardTrainerRole",
                          {"model_dir": c.model.path, "actor": a, "dtype": c.model.dtype, "seed": c.trainer.seed,
                           "total_steps": c.trainer.total_training_steps},
                          GroupMesh(dp=a.data_parallel_size, tp=1, pp=1))]

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

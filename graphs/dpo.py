"""Direct preference optimisation: one iteration as a Dask graph.

    pairs  = a batch of (chosen, rejected) pairs, adjacent rows       (client, this step's table)
    ref    = reference log-probs of both completions       on ref     (once per batch)
    stats  = DPO / IPO loss of policy against reference    on actor   (flowrl.algos.dpo_loss)
    return pairs, stats

Data: TRL's pair Parquet (prompt, chosen, rejected; ``flowrl.data.pairs``); ``data.train_batch_size``
pairs a step, one optimizer step per ``actor.ppo_mini_batch_size`` pairs, micro-batches of
``actor.ppo_micro_batch_size_per_gpu`` pairs. The reference is the initial model on its own group
(with LoRA: the actor's base model, adapters disabled), at temperature 1. Metrics as TRL's:
``actor/rewards/{chosen,rejected,margins,accuracies}``, ``actor/logps/{chosen,rejected}``;
validation the same on ``data.val_files`` (``val-core/dpo/...``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from flowrl.config import ConfigError, RunConfig
from flowrl.graphs import post_training as pt
from flowrl.graphs.family import BuildContext, Family, IterationGraph, register_family
from flowrl.nodes import NodeOut, node

LOSS = "flowrl.algos.dpo_loss:DPO_LOSS"


@register_family("dpo")
class DPO(Family):
    """The policy against a frozen reference on preference pairs; no generation."""

    pairs = True

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        pt.check_layout(cfg, self.name, pairs=self.pairs)
        if cfg.model.lora_rank and cfg.rollout.logprob_temperature != 1.0:
            raise ConfigError("rollout.temperature", cfg.rollout.temperature, "sets the temperature of LoRA's reference "
                              "log-probs, which DPO reads at temperature 1", "set rollout.temperature=1.0")

    def group_specs(self) -> list[Any]:
        from flowrl.roles.specs import actor_spec, ref_spec

        if self.cfg.model.lora_rank:  # the reference is the actor's base model (roles.specs.reference_call)
            return [actor_spec(self.cfg)]
        ref = ref_spec(self.cfg)
        return [actor_spec(self.cfg), dataclasses.replace(ref, role_kwargs={**ref.role_kwargs, "temperature": 1.0})]

    @classmethod
    def load_data(cls, cfg: RunConfig, tokenizer: Any, which: str = "train") -> Any:
        """The tokenized pairs of ``data.train_files`` (``which="val"``: ``data.val_files``)."""
        from flowrl.data.pairs import PairDataset

        return PairDataset(pt.data_files(cfg, which), tokenizer, prompt_key=cfg.data.prompt_key,
                           max_length=cfg.algorithm.sft.max_length, truncation=cfg.data.truncation)

    def loss_options(self) -> dict:
        d = self.cfg.algorithm.dpo
        return {"beta": d.beta, "loss_type": d.loss_type, "label_smoothing": d.label_smoothing}

    def _ref(self, ctx: BuildContext, table: Any, *, step: int, name: str = "ref") -> Any:
        from flowrl import nodes
        from flowrl.roles.specs import reference_call

        group, method = reference_call(self.cfg)
        return node(name, nodes.logprobs, ctx.groups[group].bind(), table, "ref_logprobs", method=method, step=step)

    def build(self, ctx: BuildContext, prompts: pa.Table, *, step: int, collected: NodeOut | None = None) -> IterationGraph:
        from flowrl import nodes

        ref = self._ref(ctx, prompts, step=step)
        batch = node("join_ref", nodes.join_columns, prompts, ref, step=step)
        stats = pt.update(ctx, batch, step=step, loss=LOSS, options=self.loss_options(), pairs=self.pairs)
        return IterationGraph(result=node("collect", pt.result, batch, stats, step=step),
                              sync=node("sync", pt.no_sync, stats, step=step))

    def validation(self, ctx: BuildContext, table: pa.Table, *, step: int) -> Any:
        """``val-core/dpo/...`` of ``table`` (pairs) with the current weights."""
        ref = self._ref(ctx, table, step=step, name="val_ref")
        logp = node("val_logprobs", pt.supervised_logprobs, ctx.groups["actor"].bind(), table, "logprobs", step=step)
        return node("validate", pt.held_out, table, logp, ref, loss=LOSS, options=self.loss_options(), family=self.name,
                    step=step)

"""Supervised fine-tuning: one iteration as a Dask graph.

    batch  = a batch of conversations, tokenized once           (client, this step's table)
    stats  = next-token NLL on the assistant tokens only  on actor   (flowrl.algos.sft_loss)
    return batch, stats

Data: verl's SFT Parquet (``messages``, or prompt/response columns; ``flowrl.data.chat``);
``data.train_batch_size`` conversations a step, one optimizer step per
``actor.ppo_mini_batch_size`` of them, micro-batches of ``actor.ppo_micro_batch_size_per_gpu``
(or packed by ``actor.ppo_max_token_len_per_gpu`` with ``actor.use_dynamic_bsz``). Validation:
the held-out loss on ``data.val_files`` (``val-core/sft/loss``). Any train backend (dp, fsdp,
megatron, LoRA) through the policy role's ``train_supervised``; checkpoints are the actor's.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from flowrl.config import RunConfig
from flowrl.graphs import post_training as pt
from flowrl.graphs.family import BuildContext, Family, IterationGraph, register_family
from flowrl.nodes import NodeOut, node

LOSS = "flowrl.algos.sft_loss:SFT_LOSS"


@register_family("sft")
class SFT(Family):
    """Next-token prediction on demonstrations: the actor alone, no generation."""

    pairs = False

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        pt.check_layout(cfg, self.name, pairs=self.pairs)

    def group_specs(self) -> list[Any]:
        from flowrl.roles.specs import actor_spec

        return [actor_spec(self.cfg)]

    @classmethod
    def load_data(cls, cfg: RunConfig, tokenizer: Any, which: str = "train") -> Any:
        """The tokenized conversations of ``data.train_files`` (``which="val"``: ``data.val_files``)."""
        from flowrl.data.chat import ChatDataset

        s, d = cfg.algorithm.sft, cfg.data
        return ChatDataset(pt.data_files(cfg, which), tokenizer, messages_key=s.messages_key, prompt_key=d.prompt_key,
                           response_key=s.response_key, max_length=s.max_length, truncation=d.truncation)

    def loss_options(self) -> dict:
        return {}

    def build(self, ctx: BuildContext, prompts: pa.Table, *, step: int, collected: NodeOut | None = None) -> IterationGraph:
        stats = pt.update(ctx, prompts, step=step, loss=LOSS, options=self.loss_options(), pairs=self.pairs)
        return IterationGraph(result=node("collect", pt.result, prompts, stats, step=step),
                              sync=node("sync", pt.no_sync, stats, step=step))

    def validation(self, ctx: BuildContext, table: pa.Table, *, step: int) -> Any:
        """The held-out loss (``val-core/sft/loss``) of ``table`` with the current weights."""
        logp = node("val_logprobs", pt.supervised_logprobs, ctx.groups["actor"].bind(), table, "logprobs", step=step)
        return node("validate", pt.held_out, table, logp, loss=LOSS, options=self.loss_options(), family=self.name,
                    step=step)

"""Supervised fine-tuning: one iteration as a Dask graph.

    batch  = a batch of conversations, tokenized once           (client, this step's table)
    stats  = next-token NLL on the assistant tokens only  on actor   (flowrl.algos.sft_loss)
    return batch, stats

Data: verl's SFT Parquet (``messages``, or prompt/response columns; ``flowrl.data.chat``);
``data.train_batch_size`` conversations a step, one optimizer step per
``actor.ppo_mini_batch_size`` of them, micro-batches of ``actor.ppo_micro_batch_size_per_gpu``
(or packed by ``actor.ppo_max_token_len_per_gpu`` with ``actor.use_dynamic_bsz``). Validation:
the held-out loss on ``data.val_files`` (``val-core/sft/sft_loss``, the plain NLL). With
``algorithm.sft.label_smoothing`` the loss smooths the targets over the vocabulary
(``flowrl.algos.sft_loss``). Any train backend (dp, fsdp,
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
        pt.check_token_stat(cfg, "algorithm.sft.label_smoothing", cfg.algorithm.sft.label_smoothing,
                            self.loss_options())

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
        """The training loss's options: label smoothing (held-out: the plain NLL)."""
        eps = self.cfg.algorithm.sft.label_smoothing
        return {"label_smoothing": eps} if eps > 0 else {}

    def build(self, ctx: BuildContext, prompts: pa.Table, *, step: int, collected: NodeOut | None = None) -> IterationGraph:
        stats = pt.update(ctx, prompts, step=step, loss=LOSS, options=self.loss_options(), pairs=self.pairs)
        return IterationGraph(result=node("collect", pt.result, prompts, stats, step=step),
                              sync=node("sync", pt.no_sync, stats, step=step))

    def validation(self, ctx: BuildContext, table: pa.Table, *, step: int) -> Any:
        """The held-out loss (``val-core/sft/loss``) of ``table`` with the current weights."""
        logp = node("val_logprobs", pt.supervised_logprobs, ctx.groups["actor"].bind(), table, "logprobs", step=step)
        return node("validate", pt.held_out, table, logp, loss=LOSS, options={}, family=self.name, step=step)


class InProcessSFT:
    """The ``sft`` family's update on one rank in this process, with no Dask cluster: what the
    default task's warm-up runs (its model is a few hundred kilobytes; a cluster's start and a
    graph per step would cost more than the training).

    It is the run's path without the graph: the config is checked as ``flowrl train
    algorithm.family=sft`` checks it (the family's own checks included), the batches are the
    run's (``dataset.batch(step, data.train_batch_size, seed=trainer.seed)``), the rank holds the
    policy role the actor group's spec names, and each step is the ``update_actor`` node's call,
    ``role.train_supervised`` with the family's loss and options. ``dataset``: the rows to train
    on (a :class:`~flowrl.data.chat.TokenRows`); None: ``data.train_files`` read as the family
    reads them.
    """

    def __init__(self, cfg: RunConfig, dataset: Any = None) -> None:
        from transformers import AutoTokenizer

        from flowrl.registry import import_string
        from flowrl.roles.specs import actor_spec

        spec = actor_spec(cfg)
        if spec.mesh.world_size != 1:
            raise ValueError(f"InProcessSFT runs one rank, the actor's mesh has {spec.mesh.world_size}: set "
                             "actor.data_parallel_size (and the model-parallel sizes) to 1, or run flowrl train "
                             "algorithm.family=sft")
        self.cfg, self.family = cfg, SFT(cfg)
        self.dataset = dataset if dataset is not None else SFT.load_data(cfg, AutoTokenizer.from_pretrained(cfg.model.path))
        self.role = import_string(spec.role_cls)(rank=0, world_size=1, **spec.role_kwargs)

    def step(self, step: int) -> dict[str, float]:
        """One training step (``step`` counts from 0): the ``actor/*`` stats."""
        table = self.dataset.batch(step, self.cfg.data.train_batch_size, seed=self.cfg.trainer.seed,
                                   shuffle=self.cfg.data.shuffle)
        return self.role.train_supervised(table, loss=LOSS, mini_batch_rows=pt.mini_batch_rows(self.cfg, pairs=False),
                                          options=self.family.loss_options())

    @property
    def model(self) -> Any:
        """The trained transformers module (for evaluations between steps)."""
        return self.role.engine.model

    def save(self, directory: str) -> None:
        """A transformers directory of the trained weights (``flowrl export-hf``'s format)."""
        self.role.engine.save_hf(directory)

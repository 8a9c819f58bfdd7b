"""Pieces the supervised families share (``sft``, ``dpo``): their data, the update with a
:class:`~flowrl.algos.supervised.SupervisedLoss` on the actor group, the step's result, the
held-out metrics, and the checks of their settings (before any worker starts).

A supervised step has no rollout group and no weight sync: its graph is ``update_actor`` (after
the reference log-probs, for DPO) and ``collect``; ``sync`` is a node that waits for the update
and syncs nothing.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.actors.group import BoundCall
from flowrl.config import ConfigError, RunConfig
from flowrl.data import experience
from flowrl.metrics import names
from flowrl.nodes import NodeOut, node

VALIDATION = names.VALIDATION_PREFIX + "core/"
"""Held-out metrics: ``val-core/<family>/<stat>``."""


# --------------------------------------------------------------------------- settings
def check_layout(cfg: RunConfig, family: str, *, pairs: bool) -> None:
    """The batch sizes against the actor's data-parallel size (rows, or pairs that must stay
    whole on one rank), and pairs against the token budget; ConfigError naming the key."""
    a, d = cfg.actor, cfg.data
    what = "pairs" if pairs else "rows"
    for key, value in (("data.train_batch_size", d.train_batch_size), ("actor.ppo_mini_batch_size", a.ppo_mini_batch_size)):
        if value % a.data_parallel_size:
            raise ConfigError(key, value, f"is not divisible by actor.data_parallel_size={a.data_parallel_size}: the "
                              f"{family} family gives each data-parallel rank the same number of {what}",
                              f"use a multiple of {a.data_parallel_size}")
    if pairs and a.use_dynamic_bsz is True:  # auto: never packs pairs (flowrl.roles.supervised.token_budget)
        raise ConfigError("actor.use_dynamic_bsz", True, f"the {family} family's micro-batches hold whole "
                          "(chosen, rejected) pairs, which a token budget could part",
                          "set actor.use_dynamic_bsz=false (actor.ppo_micro_batch_size_per_gpu counts pairs)")


def check_token_stat(cfg: RunConfig, key: str, value: Any, options: dict) -> None:
    """The actor's train backend computes the per-token statistic the SFT loss needs with
    ``options`` (its spec's ``token_stats``); ConfigError naming ``key`` otherwise."""
    from flowrl.algos.sft_loss import SFT_LOSS
    from flowrl.catalog.backends import TRAIN_BACKENDS

    stat = SFT_LOSS.stat_for(options)
    able = TRAIN_BACKENDS.names_where(lambda spec: stat in spec.token_stats)
    if stat is not None and cfg.actor.strategy not in able:
        raise ConfigError(key, value, f"needs the per-token {stat!r} of the logits, which actor.strategy="
                          f"{cfg.actor.strategy} does not compute", f"set {key}=0, or actor.strategy to one of "
                          f"{', '.join(able)}")


def mini_batch_rows(cfg: RunConfig, *, pairs: bool) -> int:
    """Rows per data-parallel rank in one optimizer step: ``actor.ppo_mini_batch_size`` rows (or
    pairs, two rows each) over the ranks."""
    return cfg.actor.ppo_mini_batch_size * (2 if pairs else 1) // cfg.actor.data_parallel_size


def data_files(cfg: RunConfig, which: str) -> list[str]:
    files = cfg.data.train_files if which == "train" else cfg.data.val_files
    return [f for f in files.split(",") if f]


# --------------------------------------------------------------------------- node bodies
def train_supervised(actor: BoundCall, table: pa.Table, mini_batch_rows: int, loss: str, options: dict) -> NodeOut:
    """The actor's supervised update (``actor/*`` stats), split by data-parallel rank."""
    metrics, compute_s = actor.run("train_supervised", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.OUTPUT,
                                   kwargs={"loss": loss, "mini_batch_rows": mini_batch_rows, "options": options})
    return NodeOut(metrics, {**metrics, names.compute("update_actor"): compute_s})


def supervised_logprobs(actor: BoundCall, table: pa.Table, column: str) -> NodeOut:
    """``column``: the actor's response-token log-probs at temperature 1 (held-out metrics)."""
    result, compute_s = actor.run("supervised_logprobs", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT,
                                  kwargs={"column": column})
    return NodeOut(result, {names.compute(column): compute_s})


def result(table: pa.Table, *_after: Any) -> NodeOut:
    """The step's result: the batch and its token counts."""
    prompt, response = experience.lengths(table, "prompt_ids"), experience.lengths(table, "response_ids")
    return NodeOut(table, {names.NUM_SAMPLES: float(table.num_rows), names.NUM_RESPONSE_TOKENS: float(response.sum()),
                           names.NUM_TOKENS: float(response.sum() + prompt.sum()),
                           names.RESPONSE_LENGTH_MEAN: float(response.mean()),
                           names.PROMPT_LENGTH_MEAN: float(prompt.mean())})


def no_sync(*_after: Any) -> NodeOut:
    """A supervised step's stand-in for the weight sync: no rollout group, nothing to sync."""
    return NodeOut(None, {})


def held_out(table: pa.Table, *columns: Any, loss: str, options: dict, family: str) -> NodeOut:
    """``val-core/<family>/<stat>``: the loss and its stats on the whole held-out table (no
    gradient), from the log-prob ``columns`` (``logprobs``, and ``ref_logprobs`` for DPO)."""
    from flowrl.algos.supervised import Totals, means
    from flowrl.data.packed import PackedBatch
    from flowrl.roles.supervised import load_loss

    from flowrl.nodes.core import join_columns

    spec = load_loss(loss)
    table = join_columns(table, *columns)
    batch = PackedBatch.from_table(table, tuple(spec.fields) + ("logprobs",))
    totals = Totals(spec.count(batch.token_fields, batch.response_cu_B1))
    _, sums = spec.fn(batch.token_fields["logprobs"], batch.token_fields, batch.response_cu_B1, totals=totals, **options)
    return NodeOut(None, {f"{VALIDATION}{family}/{k}": v for k, v in means(sums, totals).items()})


# --------------------------------------------------------------------------- graph pieces
def update(ctx: Any, batch: Any, *, step: int, loss: str, options: dict, pairs: bool) -> Any:
    """``update_actor``: one supervised update of the actor group on ``batch``."""
    return node("update_actor", train_supervised, ctx.groups["actor"].bind(), batch,
                mini_batch_rows(ctx.cfg, pairs=pairs), loss, options, step=step)

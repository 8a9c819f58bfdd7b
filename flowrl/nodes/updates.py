"""Update nodes: one PPO update (epochs over mini-batches) on the actor or the critic group."""

from __future__ import annotations

import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.actors.group import BoundCall
from flowrl.metrics import names
from flowrl.nodes.core import NodeOut


def _update(group: BoundCall, table: pa.Table, mini_batch_rows: int, what: str) -> NodeOut:
    """The group's ``update`` on ``table`` (split by dp rank); its stats are the value and the
    metrics, plus ``compute_s/<what>``."""
    metrics, compute_s = group.run(
        "update", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.OUTPUT, kwargs={"mini_batch_rows": mini_batch_rows}
    )
    return NodeOut(metrics, {**metrics, names.compute(what): compute_s})


def update(actor: BoundCall, table: pa.Table, mini_batch_rows: int) -> NodeOut:
    """The actor's PPO-clip update (``actor/*`` stats)."""
    return _update(actor, table, mini_batch_rows, "update_actor")


def update_critic(critic: BoundCall, table: pa.Table, mini_batch_rows: int) -> NodeOut:
    """The critic's clipped value-loss update (``critic/*`` stats)."""
    return _update(critic, table, mini_batch_rows, "update_critic")


def critic_warmup(*_after: object) -> NodeOut:
    """A critic-only step's stand-in for the weight sync (``trainer.critic_warmup``): nothing to
    sync; ``critic/warmup`` = 1."""
    return NodeOut(None, {names.CRITIC_WARMUP: 1.0})

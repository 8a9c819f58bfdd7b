"""Model calls that score the sampled responses token by token: log-probs (actor, reference)
and the critic's values. Each returns a one-column table, row-aligned with its input."""

from __future__ import annotations

import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.actors.group import BoundCall
from flowrl.metrics import names
from flowrl.nodes.core import NodeOut


def logprobs(group: BoundCall, table: pa.Table, column: str, method: str = "compute_logprobs") -> NodeOut:
    """A one-column table of ``column`` (log-probs of the sampled responses under the group's model,
    by the group's ``method``: ``compute_ref_logprobs`` is the actor's base model under LoRA)."""
    result, compute_s = group.run(
        method, table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT, kwargs={"column": column}
    )
    return NodeOut(result, {names.compute(column): compute_s})


def values(critic: BoundCall, table: pa.Table) -> NodeOut:
    """A one-column table of ``values``: the critic's value of every response token."""
    result, compute_s = critic.run("compute_values", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT)
    return NodeOut(result, {names.compute("values"): compute_s})

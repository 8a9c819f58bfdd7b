"""The rollout correction's bypass mode (``algorithm.rollout_is_bypass``, verl's
``apply_bypass_mode``): the rollout's own log-probs stand in for the pre-update ones, so no
old-log-prob pass runs."""

from __future__ import annotations

import pyarrow as pa

from flowrl.nodes.core import NodeOut


def rollout_as_old_logprobs(table: pa.Table) -> NodeOut:
    """A one-column table ``old_logprobs`` = the batch's ``rollout_logprobs`` (``pi_old := pi_rollout``)."""
    if "rollout_logprobs" not in table.column_names:
        raise ValueError("algorithm.rollout_is_bypass=true needs the rollout's log-probs (column 'rollout_logprobs'); "
                         f"the batch has {table.column_names}")
    return NodeOut(pa.table({"old_logprobs": table.column("rollout_logprobs")}), {})

"""Generation nodes: responses from the rollout group (sampled, greedy, validation's)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.actors.group import BoundCall
from flowrl.checks.tokens import with_response_hash
from flowrl.data import experience
from flowrl.metrics import names
from flowrl.nodes.core import NodeOut
from flowrl.roles.accounting import generation_metrics


def _generate(rollout: BoundCall, prompts: pa.Table, kwargs: dict, what: str) -> NodeOut:
    """One ``generate`` call on every rollout rank (prompts split by dp rank); ``compute_s/<what>``,
    and for the step's own generation (``gen``) the ``perf/gen_*`` accounting."""
    table, compute_s = rollout.run("generate", prompts, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT, kwargs=kwargs)
    table, stats = experience.pop_stats(table)
    metrics = {names.compute(what): compute_s}
    if what == "gen":
        tokens = float(experience.lengths(table, "response_ids").sum()) if table.num_rows else 0.0
        metrics.update(generation_metrics(stats, response_tokens=tokens, seconds=compute_s))
    return NodeOut(table, metrics)


def generate(rollout: BoundCall, prompts: pa.Table, seed: int, weight_version: int | None = None) -> NodeOut:
    """``rollout.n`` responses per prompt with the group's sampling parameters, seeded; with
    multi-turn rollouts also the ``agent/*`` metrics (:func:`agent_metrics`). With
    ``weight_version`` (asynchronous RL) every row is tagged with it (column ``weight_version``).
    Each row carries the hash of its ``response_ids`` (``response_hash``: the ``tokens`` check
    holds the trained tokens to it, ``flowrl.checks.tokens``)."""
    out = _generate(rollout, prompts, {"seed": seed}, "gen")
    out.value = with_response_hash(out.value)
    out.metrics.update(agent_metrics(out.value))
    if weight_version is not None:
        out.value = out.value.append_column("weight_version", pa.array([weight_version] * out.value.num_rows, pa.int64()))
    return out


def agent_metrics(table: pa.Table) -> dict[str, float]:
    """Turns and tool calls per trajectory, the failed and the well-formed share of the calls, the
    tools' reward hooks and the share of each finish reason; none for single-turn tables."""
    if "num_turns" not in table.column_names:
        return {}
    calls = table.column("tool_calls").to_numpy()
    total = max(int(calls.sum()), 1)
    reasons = table.column("finish_reason").to_pylist()
    out = {
        names.AGENT_NUM_TURNS_MEAN: float(table.column("num_turns").to_numpy().mean()),
        names.AGENT_TOOL_CALLS_MEAN: float(calls.mean()),
        names.AGENT_TOOL_ERROR_FRAC: float(table.column("tool_errors").to_numpy().sum()) / total,
        names.AGENT_WELL_FORMED_CALL_FRAC: 1.0 - float(table.column("malformed_calls").to_numpy().sum()) / total,
        names.AGENT_TOOL_REWARD_MEAN: float(table.column("tool_reward").to_numpy().mean()),
    }
    for reason in ("stop", "length", "max_turns"):
        out[names.agent_finish_reason(reason)] = reasons.count(reason) / max(len(reasons), 1)
    return out


def generate_greedy(rollout: BoundCall, prompts: pa.Table, sampling: Any) -> NodeOut:
    """One greedy response per prompt (``sampling``: n=1, temperature 0): ReMax's baseline."""
    return _generate(rollout, prompts, {"sampling": sampling}, "gen_baseline")


def generate_val(rollout: BoundCall, prompts: pa.Table, sampling: Any, seed: int) -> NodeOut:
    """Validation's responses: ``sampling`` (``rollout.val_kwargs``), seeded."""
    return _generate(rollout, prompts, {"seed": seed, "sampling": sampling}, "val_gen")

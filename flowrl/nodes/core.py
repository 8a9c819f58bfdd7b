"""The node machinery: :func:`node` wraps a body as one Dask task, :class:`NodeOut` carries its
value, metrics and spans downstream.

A node is a coarse task: it takes worker-group calls (``BoundCall``, sequence number reserved
when the graph was built) and tables, dispatches one method to every rank, waits with a timeout
and returns a :class:`NodeOut`: the value plus metrics. :func:`node` wraps a body so that its wall
time lands in ``timing_s/<name>``, its wall-clock start and end in ``NodeOut.spans``, and metrics
and spans flow downstream to the last node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa

from flowrl.data import experience
from flowrl.metrics import names


@dataclass
class NodeOut:
    """What a node computes to: its ``value`` (a table, stats, None) and what flows downstream."""

    value: Any
    metrics: dict[str, float] = field(default_factory=dict)
    """Metric name -> value of this node and every node upstream of it."""
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Node name -> (start, end) wall-clock seconds (``time.time()``) of this node and every node
    upstream of it; the run writes them to ``timeline.jsonl`` (the dashboard's Gantt)."""


def node(name: str, fn: Callable[..., Any], *args: Any, step: int = 0, **kwargs: Any) -> Any:
    """A delayed call of ``fn`` as the graph node ``name`` (key ``name-<step:06d>``).

    A config section among the arguments (a ``RunConfig``) travels as one opaque value: Dask
    would otherwise walk every field of the nested dataclasses looking for collections when the
    graph is built, and rebuild each dataclass (its checks included) when the node runs
    (measured: about 10 ms per step of the smallest benchmark cell, driver side)."""
    from dask import delayed

    args = tuple(_opaque(a) for a in args)
    kwargs = {k: _opaque(v) for k, v in kwargs.items()}
    return delayed(_run_node, pure=False)(name, fn, *args, dask_key_name=f"{name}-{step:06d}", **kwargs)


class _Opaque:
    """A node argument Dask passes through as it is (unwrapped by the node)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _opaque(x: Any) -> Any:
    return _Opaque(x) if type(x).__module__.startswith("flowrl.config") else x


def _run_node(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> NodeOut:
    metrics: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}

    def unwrap(x: Any) -> Any:
        if isinstance(x, _Opaque):
            return x.value
        if isinstance(x, NodeOut):
            metrics.update(x.metrics)
            spans.update(x.spans)
            return x.value
        return x

    args = tuple(unwrap(a) for a in args)
    kwargs = {k: unwrap(v) for k, v in kwargs.items()}
    wall_start = time.time()
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    elapsed = time.perf_counter() - start
    if isinstance(out, NodeOut):
        metrics.update(out.metrics)
        spans.update(out.spans)
        out = out.value
    metrics[names.timing(name)] = elapsed
    spans[name] = (wall_start, wall_start + elapsed)
    return NodeOut(out, metrics, spans)


def join_columns(table: pa.Table, *columns: pa.Table) -> pa.Table:
    """``table`` with every column of each table in ``columns`` (one-column results of the
    log-prob and value nodes, row-aligned with ``table``) added or replaced."""
    for extra in columns:
        table = experience.with_columns(table, **{name: extra.column(name) for name in extra.column_names})
    return table

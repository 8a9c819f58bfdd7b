"""What families and their building pieces share: the context a graph is built from
(:class:`BuildContext`), one iteration's graph (:class:`IterationGraph`) and a family's driver
state (:class:`FamilyState`). Re-exported by ``flowrl.graphs.family``; kept apart so that the
pieces (``pieces``, ``stream_pieces``) need not import the family module, whose default
:meth:`~flowrl.graphs.family.Family.rollout_piece` builds on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask

from flowrl.actors import WorkerGroup
from flowrl.config import RunConfig


@dataclass
class BuildContext:
    """What a family builds a graph from: the run's config, its worker groups by name
    (``rollout``, ``actor``, ``ref``, ``critic``, ``rm``: those the family declared) and the
    directory of the tokenizer that decodes responses for the reward function."""

    cfg: RunConfig
    groups: dict[str, WorkerGroup]
    tokenizer_dir: str


@dataclass
class IterationGraph:
    """One iteration: ``result`` computes to ``NodeOut(table, metrics)``; ``sync`` to the
    reshard's ``NodeOut(None, metrics)``. Compute both (``Session.submit``)."""

    result: Any
    sync: Any

    @property
    def outputs(self) -> list[Any]:
        return [self.result, self.sync]

    def visualize(self, filename: str = "grpo", **kwargs: Any) -> Any:
        """Draw the graph (needs graphviz)."""
        return dask.visualize(*self.outputs, filename=filename, **kwargs)

    def dependencies(self) -> dict[str, set[str]]:
        """Task key -> the keys it depends on."""
        from dask.highlevelgraph import HighLevelGraph

        graph = HighLevelGraph.merge(*(o.__dask_graph__() for o in self.outputs))
        return {str(k): {str(d) for d in deps} for k, deps in graph.get_all_dependencies().items()}


class FamilyState:
    """Driver state a family keeps across steps; this one holds nothing (``state_dict()`` is
    empty, so checkpoints get no ``algorithm_state``)."""

    def observe(self, metrics: dict[str, float]) -> None:
        """After a step: take what the step measured (its metrics)."""

    def state_dict(self) -> dict:
        """What a checkpoint keeps (``extra["algorithm_state"]``); empty: nothing."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Back to what :meth:`state_dict` returned (a checkpoint's ``algorithm_state``)."""

    def reset(self) -> None:
        """Back to the state of a fresh run."""

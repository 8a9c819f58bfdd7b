"""Generation nodes: responses from the rollout group (sampled, greedy, validation's)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.actors.group import BoundCall
from flowrl.metrics import names
from flowrl.nodes.core import NodeOut


def _generate(rollout: BoundCall, prompts: pa.Table, kwargs: dict, what: str) -> NodeOut:
    """One ``generate`` call on every rollout rank (prompts split by dp rank); ``compute_s/<what>``."""
    table, compute_s = rollout.run("generate", prompts, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT, kwargs=kwargs)
    return NodeOut(table, {names.compute(what): compute_s})


def generate(rollout: BoundCall, prompts: pa.Table, seed: int) -> NodeOut:
    """``rollout.n`` responses per prompt with the group's sampling parameters, seeded."""
    return _generate(rollout, prompts, {"seed": seed}, "gen")


def generate_greedy(rollout: BoundCall, prompts: pa.Table, sampling: Any) -> NodeOut:
    """One greedy response per prompt (``sampling``: n=1, temperature 0): ReMax's baseline."""
    return _generate(rollout, prompts, {"sampling": sampling}, "gen_baseline")


def generate_val(rollout: BoundCall, prompts: pa.Table, sampling: Any, seed: int) -> NodeOut:
    """Validation's responses: ``sampling`` (``rollout.val_kwargs``), seeded."""
    return _generate(rollout, prompts, {"seed": seed, "sampling": sampling}, "val_gen")

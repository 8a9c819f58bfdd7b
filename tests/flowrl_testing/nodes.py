"""Graph-node bodies only the tests use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowrl.actors.dispatch import Gather
from flowrl.nodes.core import NodeOut
from flowrl.nodes.weights import reshard_metrics

if TYPE_CHECKING:
    from flowrl.actors.group import BoundCall
    from flowrl.backends.reshard import ReshardJob


def reshard_local(group: "BoundCall", _after: Any, job: "ReshardJob") -> NodeOut:
    """Colocated reshard (``job.placement`` colocated): each rank of one group
    (``flowrl_testing.hybrid.HybridRole``) moves its trainer's shards into the group's
    generation engines."""
    stats, seconds = group.run("reshard", job, gather_mode=Gather.ALL)
    return NodeOut(None, reshard_metrics(stats, seconds))

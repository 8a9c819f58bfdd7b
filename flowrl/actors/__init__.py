"""Thin Dask actors and worker groups: placement, ordered dispatch, timeouts, shutdown."""

from flowrl.actors.dispatch import Gather, GroupMesh, Scatter
from flowrl.actors.group import GroupCallError, GroupLostError, WorkerGroup
from flowrl.actors.session import Session

__all__ = ["Gather", "GroupCallError", "GroupLostError", "GroupMesh", "Scatter", "Session", "WorkerGroup"]

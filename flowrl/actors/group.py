"""Worker groups: N rank actors, one per worker process, forming one torch.distributed group.

A :class:`WorkerGroup` handle is small and picklable: graph nodes (Dask tasks) receive it and
call :meth:`WorkerGroup.run`. Each call needs a sequence number reserved on the client when the
graph is built (:meth:`WorkerGroup.reserve`), so every rank runs the group's calls in one order
(see ``rank.py``). A graph built only to be looked at (a draft, :func:`draft`) gives its numbers
back as soon as it is built; they are taken again only if the draft itself is submitted.
Every wait has a timeout; a dead worker surfaces as :class:`GroupLostError`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from flowrl.actors.dispatch import Gather, GroupMesh, Scatter, gather, scatter


class GroupLostError(RuntimeError):
    """A worker holding one of the group's ranks died; the group must be rebuilt."""


class GroupCallError(RuntimeError):
    """A rank raised while running a call."""


class CallOrder:
    """A group's sequence counter, shared by its views (0 is the ranks' set-up). ``count`` is
    the iterator the numbers come from; ``next`` the number it hands out next."""

    def __init__(self, first: int = 1) -> None:
        self.next = first
        self.count = itertools.count(first)

    def take(self) -> int:
        self.next = next(self.count) + 1
        return self.next - 1

    def restart_at(self, first: int) -> None:
        """Hand out numbers from ``first`` on: back (a draft gives back numbers nothing was
        sent with) or forward (a submitted draft takes the numbers it was built with)."""
        self.next, self.count = first, itertools.count(first)


@dataclass
class WorkerGroup:
    name: str
    actors: list[Any]  # distributed.Actor handles, rank order
    addresses: list[str]  # worker address of each rank
    mesh: GroupMesh
    timeout_s: float = 600.0
    _order: CallOrder = field(default_factory=CallOrder, repr=False)
    part: str = ""
    """A view's part of the ranks' role (``cluster.placement=hybrid``: ``"rollout"`` calls
    ``role.rollout.<method>``); empty: the role itself."""
    shares_weights: bool = False
    """Every rank generates with its training parameters themselves (the hybrid engine where the
    layouts agree): a weight sync between views of this group has nothing to move or call."""
    devices: tuple = ()
    """Each rank's GPU from the run's device plan, ``(node, GPU)`` of the first GPU it sees (its
    ``cuda:0``); empty: a group without GPUs. The weight sync's wire is chosen from it
    (``flowrl.backends.reshard.wire_plan``)."""

    @property
    def world_size(self) -> int:
        return len(self.actors)

    def view(self, name: str, part: str, mesh: GroupMesh | None = None) -> "WorkerGroup":
        """The same ranks under another name, calling ``role.<part>.<method>`` (one process holds
        several roles: the hybrid engine). Views share this group's call order (one sequence
        counter), so every call of every view runs in the order the graph reserved it.
        ``mesh`` (same world size) splits payloads its own way, e.g. generation dp = world."""
        mesh = mesh or self.mesh
        if mesh.world_size != self.world_size:
            raise ValueError(f"view {name!r} of group {self.name!r}: mesh {mesh} has {mesh.world_size} ranks, "
                             f"the group {self.world_size}")
        return WorkerGroup(name, self.actors, self.addresses, mesh, self.timeout_s, self._order, part, self.shares_weights,
                           self.devices)

    def method(self, name: str) -> str:
        """The rank-side name of role method ``name`` (``part.name`` in a view)."""
        return f"{self.part}.{name}" if self.part and not name.startswith("_") else name

    @property
    def _counter(self) -> Any:
        """The iterator of the group's sequence numbers (shared by its views)."""
        return self._order.count

    def reserve(self) -> int:
        """Reserve the next sequence number (client side, while building a graph)."""
        return self._order.take()

    def bind(self) -> "BoundCall":
        """Reserve a sequence number now (graph build time) for one call made later in a node."""
        return BoundCall(self, self.reserve())

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_order"] = None  # the counter stays with the client
        return state

    def run(
        self,
        seq: int,
        method: str,
        payload: Any = None,
        *,
        scatter_mode: Scatter = Scatter.BROADCAST,
        gather_mode: Gather = Gather.ALL,
        kwargs: dict | None = None,
        timeout: float | None = None,
    ) -> tuple[Any, float]:
        """Call ``method`` on every rank (ordered by ``seq``); return (gathered result, max
        seconds any rank spent on the work itself)."""
        args = scatter(scatter_mode, payload, self.mesh)
        per_rank = self._call_all(seq, method, [(a,) if payload is not None else () for a in args], kwargs, timeout)
        values = [v for v, _ in per_rank]
        return gather(gather_mode, values, self.mesh), max(s for _, s in per_rank)

    def _call_all(
        self, seq: int, method: str, args: list[tuple], kwargs: dict | None, timeout: float | None
    ) -> list[tuple[Any, float]]:
        timeout = self.timeout_s if timeout is None else timeout
        futures = [
            actor.call(seq, self.method(method), a, kwargs or {}, timeout) for actor, a in zip(self.actors, args, strict=True)
        ]
        return wait_all(futures, timeout, f"{self.name}.{method}", self.addresses)


@dataclass(frozen=True)
class BoundCall:
    """A group plus the sequence number reserved for one call; what a graph node receives."""

    group: WorkerGroup
    seq: int

    def run(self, method: str, payload: Any = None, **kwargs: Any) -> tuple[Any, float]:
        return self.group.run(self.seq, method, payload, **kwargs)


class StaleDraft(RuntimeError):
    """A draft submitted after later calls took its place in a group's order."""


@dataclass(eq=False)
class Draft:
    """The sequence numbers a graph built by :func:`draft` would use: ``start[i]`` .. ``end[i]``
    of ``orders[i]``, taken (:meth:`claim`) only when the graph itself is submitted."""

    orders: list[CallOrder]
    start: list[int]
    end: list[int]
    outputs: list[Any]

    def stale(self) -> bool:
        """Numbers of this draft went to another graph or call: it can never run."""
        return any(o.next != s for o, s in zip(self.orders, self.start, strict=True))

    def claim(self) -> None:
        """Take the draft's numbers (the graph is being submitted), or raise :class:`StaleDraft`."""
        if self.stale():
            raise StaleDraft("this graph was built as a draft (run.graph()) and later calls took its place in the "
                             "workers' call order (run.step(), a checkpoint, another graph); build it again "
                             "(run.graph()) and submit that one, or use run.step()")
        for order, end in zip(self.orders, self.end, strict=True):
            order.restart_at(end)


def draft(groups: dict[str, WorkerGroup], build: Callable[[], Any], outputs: Callable[[Any], list[Any]]) -> tuple[Any, Draft]:
    """``build()`` with the groups' sequence numbers given back afterwards: nothing waits for a
    graph that is only looked at (drawn, listed) and never submitted. Returns what ``build``
    returned and its :class:`Draft` (``outputs(built)``: the delayed objects a submit names)."""
    orders = list({id(g._order): g._order for g in groups.values()}.values())
    start = [o.next for o in orders]
    built = build()
    made = Draft(orders, start, [o.next for o in orders], list(outputs(built)))
    for order, first in zip(orders, start, strict=True):
        order.restart_at(first)
    return built, made


def wait_all(futures: list[Any], timeout: float, what: str, addresses: list[str]) -> list[Any]:
    """Wait for actor futures on their event loop: wakes the moment the last one lands, fails
    fast on the first error (naming the rank), and at the deadline.

    Seceding from the worker's thread pool while waiting (when inside a Dask task) lets other
    graph nodes run on this worker meanwhile.
    """
    import asyncio

    from distributed.utils import sync

    async def gather_all() -> list[Any]:
        async def one(i: int) -> Any:
            try:
                return await futures[i]
            except Exception as exc:  # noqa: BLE001 - re-raised with the rank named
                raise _wrap(exc, what, i, addresses[i]) from exc

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(futures))]
        done, pending = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                for p in pending:
                    p.cancel()
                raise task.exception()
        if pending:
            ranks = sorted(i for i, t in enumerate(tasks) if t in pending)
            for p in pending:
                p.cancel()
            raise TimeoutError(f"{what}: ranks {ranks} did not answer within {timeout:.0f}s")
        return [t.result() for t in tasks]

    if not futures:
        return []
    seceded = _secede()
    try:
        return sync(futures[0]._io_loop, gather_all)
    finally:
        if seceded:
            from distributed import rejoin

            rejoin()


def _wrap(exc: Exception, what: str, rank: int, address: str) -> Exception:
    text = str(exc)
    if "Worker holding Actor was lost" in text or "Unable to contact Actor" in text:
        return GroupLostError(f"{what}: rank {rank} on {address} was lost ({text}); rebuild the group")
    return GroupCallError(f"{what}: rank {rank} on {address} raised {type(exc).__name__}: {text}")


def _secede() -> bool:
    try:
        from distributed import get_worker, secede

        get_worker()
    except (ImportError, ValueError):
        return False
    secede()
    return True

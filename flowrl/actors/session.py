"""A session: a Dask cluster (local or remote) plus the worker groups placed on it.

``Session.start`` starts a ``LocalCluster`` (worker processes with one thread each, bound to
127.0.0.1 unless told otherwise), SLURM jobs, or connects to a scheduler address (all through
``flowrl.cluster``). Groups get disjoint workers, from their resource pool when the session was
started with group sizes: one rank actor per worker process. ``close`` tears the groups down
(destroying their process groups), then the client and the cluster (cancelling SLURM jobs), and
leaves no process behind.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any

from flowrl.actors.device import rank_gpus
from flowrl.actors.dispatch import GroupMesh
from flowrl.actors.group import Draft, WorkerGroup, wait_all
from flowrl.actors.main_guard import check_main_guard
from flowrl.actors.rank import RankActor
from flowrl.cluster.launch import WORKER_ENV  # noqa: F401 - re-exported (it used to live here)
from flowrl.cluster.pools import choose_workers, worker_nodes

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 8.0
"""How long :meth:`Session.close` may take in all (SIGTERM must end the run within 10 s)."""
TEARDOWN_TIMEOUT_S = 2.5
"""Of that, how long a rank's teardown (destroying its process groups) may take."""


@dataclass(frozen=True)
class GroupSpec:
    """What to build: a named group of ``mesh.world_size`` ranks, each holding ``role_cls``.
    ``backend``: the group's ``torch.distributed`` backend (``cpu:gloo,cuda:nccl`` on GPU);
    ``placements``: one ``flowrl.actors.device.placement_of`` dict per rank, from the run's device
    plan (``flowrl.run.placement.place_specs``): its GPUs, local rank and, for the choice of its
    worker, ``pool_node`` (which of its pool's nodes holds it). Empty: CPU ranks on any worker."""

    name: str
    role_cls: str
    role_kwargs: dict
    mesh: GroupMesh
    backend: str = "gloo"
    placements: tuple[dict, ...] = ()


class Session:
    def __init__(self, client: Any, cluster: Any | None, *, timeout_s: float, startup_timeout_s: float) -> None:
        self.client = client
        self.cluster = cluster  # None when connected to an external scheduler
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.groups: dict[str, WorkerGroup] = {}
        self._used: set[str] = set()
        self.controller: str | None = None  # the worker that runs graph nodes (None: any worker)
        self.handle: Any = None  # flowrl.cluster.launch.ClusterHandle (cancels SLURM jobs on close)
        self.pool_of: dict[str, str] = {}  # group name -> resource pool its ranks must run on
        self.controller_lost = False  # set when the scheduler removes the controller worker
        self._graph_futures: Any = weakref.WeakSet()  # what submit() started, cancelled if the controller goes
        self.local_graphs: Any = None  # cluster.controller=driver: flowrl.actors.local_graph.LocalGraphs
        self.node_kind = "local"  # how a worker's node is read (flowrl.cluster.pools.worker_nodes)
        self.processes_per_job = 1  # cluster.slurm.processes: workers per SLURM job
        self._drafts: list[Draft] = []  # graphs built to be looked at: their call order is taken on submit

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    def start(
        cls,
        num_workers: int,
        *,
        scheduler_address: str = "",
        host: str = "127.0.0.1",
        dashboard: bool = False,
        memory_limit: str = "4GiB",
        timeout_s: float = 600.0,
        startup_timeout_s: float = 180.0,
        low_latency: bool = True,
        cluster: Any = None,
        group_sizes: dict[str, int] | None = None,
        log_dir: str | None = None,
        scratch_dir: str | None = None,
        model_path: str = "",
        host_state_bytes: int = 0,
    ) -> "Session":
        """Start (or connect to) a cluster with ``num_workers`` worker processes for groups plus
        one controller worker that runs the graph's node tasks: nodes mostly wait on actors, and
        keeping them (and the tables they pass along) in one process saves a scheduling hop and a
        worker-to-worker transfer per edge of the graph. With ``cluster.controller=driver`` there
        is no controller worker: the graphs run in this process (``flowrl.actors.local_graph``).

        ``cluster`` (a ClusterConfig) replaces the keyword settings before it: its ``kind``
        picks LocalCluster, SLURM jobs or an existing scheduler (see ``flowrl.cluster``). With
        ``group_sizes`` ({group name: world size}) the workers come in the config's resource
        pools and :meth:`create_groups` places each group on its pool's workers. ``model_path``:
        the checkpoint the ranks load, which with ``host_state_bytes`` (offloaded state a worker keeps)
        ``cluster.memory_limit`` must hold (``flowrl.cluster.host_memory``: refused before any start)."""
        from flowrl.cluster import resolve_pools, start_cluster
        from flowrl.cluster.pools import pool_of
        from flowrl.config import ClusterConfig

        if cluster is None:
            cluster = ClusterConfig(
                kind="address" if scheduler_address else "local", scheduler_address=scheduler_address, host=host,
                dashboard=dashboard, memory_limit=memory_limit, timeout_s=timeout_s,
                startup_timeout_s=startup_timeout_s, low_latency=low_latency,
            )
        if cluster.kind == "local":  # its workers import the main script again
            check_main_guard("Session.start")
        pools = resolve_pools(cluster, group_sizes or {"workers": num_workers})
        in_driver = cluster.controller == "driver"
        handle = start_cluster(cluster, pools, log_dir=log_dir, scratch_dir=scratch_dir, controller=not in_driver,
                               model_path=model_path, host_state_bytes=host_state_bytes)
        session = cls(handle.client, handle if handle.kind != "address" else None,
                      timeout_s=cluster.timeout_s, startup_timeout_s=cluster.startup_timeout_s)
        session.handle = handle
        if in_driver:
            from flowrl.actors.local_graph import LocalGraphs

            session.local_graphs = LocalGraphs()
        session.pool_of = pool_of(pools) if group_sizes and handle.enforce_pools else {}
        session.node_kind = cluster.kind
        session.processes_per_job = cluster.slurm.processes if cluster.kind == "slurm" else 1
        session.controller = handle.controller
        session._used.add(session.controller)
        session._watch_controller()
        return session

    def _watch_controller(self) -> None:
        """When the scheduler removes the controller worker (killed, OOM), cancel every graph
        future: their tasks are pinned to its address, so they would wait forever (the nanny's
        replacement has another address). The step then fails at once, with
        ``controller_lost`` set for the recovery (``flowrl.run.recovery.lost_ranks``)."""
        if not self.controller or self.client is None:
            return
        client, address = self.client, self.controller

        async def on_event(event: Any) -> None:
            msg = event[1] if isinstance(event, tuple) and len(event) == 2 else event
            if not (isinstance(msg, dict) and msg.get("action") == "remove-worker"):
                return
            self.controller_lost = True
            futures = [f for f in list(self._graph_futures) if f.key in client.futures]
            log.warning("the controller worker %s was lost; cancelling %d graph task(s)", address, len(futures))
            if futures:
                await client._cancel(futures, reason="controller-lost",
                                     msg=f"the controller worker {address} (it runs the graph's nodes) was lost")

        client.subscribe_topic(address, on_event)

    @property
    def dashboard_link(self) -> str:
        return self.client.dashboard_link

    def worker_addresses(self) -> list[str]:
        return sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def create_group(self, name: str, role_cls: str, role_kwargs: dict | None = None, *, mesh: GroupMesh,
                     backend: str = "gloo") -> WorkerGroup:
        """Place ``mesh.world_size`` rank actors on free workers and build the role on each."""
        return self.create_groups([GroupSpec(name, role_cls, role_kwargs or {}, mesh, backend)])[name]

    def create_groups(self, specs: list["GroupSpec"]) -> dict[str, WorkerGroup]:
        """Create several groups at once: their processes join and load models concurrently."""
        free = [a for a in self.worker_addresses() if a not in self._used]
        need = sum(spec.mesh.world_size for spec in specs)
        names = [spec.name for spec in specs]
        clash = [n for n in names if n in self.groups or names.count(n) > 1]
        if clash:
            raise ValueError(f"group name(s) {sorted(set(clash))} used twice; give each group its own name")
        if len(free) < need:
            raise RuntimeError(
                f"groups {names} need {need} free workers, the cluster has {len(free)} "
                f"({len(self._used)} already hold other groups); start more workers"
            )
        start = time.perf_counter()
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        resources = {a: w.get("resources", {}) for a, w in workers.items()}
        nodes = worker_nodes(workers, self.node_kind, self.processes_per_job)
        placed: list[tuple[GroupSpec, list[str], list[Any]]] = []
        for spec in specs:
            size = spec.mesh.world_size
            if spec.placements and len(spec.placements) != size:
                raise ValueError(f"group {spec.name!r}: {len(spec.placements)} placements for {size} ranks")
            rank_nodes = [p.get("pool_node", 0) for p in spec.placements] if spec.placements else None
            addresses = choose_workers(free, resources, self.pool_of.get(spec.name), size,
                                       rank_nodes=rank_nodes, nodes=nodes)
            free = [a for a in free if a not in addresses]
            futures = [
                self.client.submit(RankActor, spec.name, rank, size, actor=True, workers=[addr], allow_other_workers=False, pure=False)
                for rank, addr in enumerate(addresses)
            ]
            placed.append((spec, addresses, futures))
        setups, setup_addresses, setup_groups, created = [], [], [], {}
        for spec, addresses, futures in placed:
            actors = [f.result(timeout=self.startup_timeout_s) for f in futures]
            self._used.update(addresses)
            group = WorkerGroup(spec.name, actors, addresses, spec.mesh, timeout_s=self.timeout_s,
                                devices=rank_gpus(spec.placements))
            self.groups[spec.name] = created[spec.name] = group
            master = actors[0].host_port().result(timeout=self.startup_timeout_s)
            args = (master, spec.role_cls, spec.role_kwargs, spec.backend, self.timeout_s)
            placements = spec.placements or (None,) * len(actors)
            setups += [a.call(0, "_setup", args, {"placement": p} if p else {}, self.startup_timeout_s)
                       for a, p in zip(actors, placements, strict=True)]
            setup_addresses += addresses
            setup_groups += [group] * len(actors)
        done = wait_all(setups, self.startup_timeout_s, f"{'/'.join(names)} setup", setup_addresses)
        for group in created.values():  # every rank's generation reads its training parameters (hybrid, same layout)
            group.shares_weights = all(info.get("shares_weights", False)
                                       for (info, _), g in zip(done, setup_groups, strict=True) if g is group)
        log.info("groups %s ready in %.1fs", names, time.perf_counter() - start)
        return created

    def hold(self, made: Draft) -> None:
        """Keep a draft (``flowrl.actors.group.draft``) until it is submitted or can no longer be."""
        self._drafts = [d for d in self._drafts if not d.stale()] + [made]

    def submit(self, outputs: list[Any]) -> list[Any]:
        """Start computing delayed outputs (node tasks on the controller worker, or in this process
        with ``cluster.controller=driver``); returns futures. Outputs of a held draft take the
        draft's sequence numbers now (``StaleDraft`` if later calls took them)."""
        for made in [d for d in self._drafts if any(o is m for o in outputs for m in d.outputs)]:
            self._drafts.remove(made)
            made.claim()
        if self.local_graphs is not None:  # cluster.controller=driver: Dask's threaded scheduler, here
            return self.local_graphs.submit(list(outputs), {a.key: a for g in self.groups.values() for a in g.actors})
        pin = {"workers": [self.controller], "allow_other_workers": False} if self.controller else {}
        futures = self.client.compute(list(outputs), **pin)
        self._graph_futures.update(futures)
        return futures

    def compute(self, graph: Any, timeout: float | None = None) -> Any:
        """Run a Dask graph (a delayed object) and return its result, with a timeout."""
        (future,) = self.submit([graph])
        try:
            return future.result(timeout=self.timeout_s if timeout is None else timeout)
        finally:
            future.release()

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Tear down groups, client and cluster within about ``timeout`` seconds, whatever
        state the ranks are in. Safe to call twice.

        Every rank of every group gets an unordered shutdown at once (no group waits for
        another, nor for calls a failed graph reserved and never made); a rank stuck in a
        collective with a dead peer is not waited for past the teardown's share of the time:
        its process goes when the cluster closes (the nannies kill what does not exit)."""
        deadline = time.monotonic() + timeout
        if self.local_graphs is not None:
            self.local_graphs.close()
        self._shutdown_groups(min(TEARDOWN_TIMEOUT_S, timeout / 3))
        if self.client is not None and self.cluster is not None:
            try:  # nannies: a worker that exits now is not restarted (it would dial a closing scheduler)
                _bounded(self.client, _prepare_nanny_exit, _left(deadline, 1.0), nanny=True)
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                log.debug("closing nannies gracefully: %s", exc)
            try:  # close worker-side clients before their scheduler goes; make worker exit quick
                _bounded(self.client, _prepare_worker_exit, _left(deadline, 2.0))
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                log.debug("closing worker clients: %s", exc)
        if self.client is not None:
            try:
                self.client.close(timeout=_left(deadline, 2.0))
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                log.debug("closing the client: %s", exc)
            self.client = None
        if self.cluster is not None:  # the ClusterHandle: closes the Dask cluster, cancels SLURM jobs
            self.cluster.close(timeout=_left(deadline, 3.0))
            self.cluster = None
        if self.handle is not None:  # kind=address: restores signal handlers; else already closed
            self.handle.close(timeout=_left(deadline, 3.0))
            self.handle = None

    def _shutdown_groups(self, timeout: float) -> None:
        """Every rank's unordered :meth:`RankActor.shutdown`, all at once, waited for together."""
        groups, self.groups = list(self.groups.values()), {}
        futures, addresses = [], []
        for group in groups:
            for actor, address in zip(group.actors, group.addresses, strict=True):
                try:
                    futures.append(actor.shutdown(timeout))
                    addresses.append(address)
                except Exception as exc:  # noqa: BLE001 - a lost worker: nothing to tear down
                    log.debug("group %s shutdown at %s: %s", group.name, address, exc)
        if not futures:
            return
        try:
            done = wait_all(futures, timeout + 1.0, "shutdown", addresses)
        except Exception as exc:  # noqa: BLE001 - shutting down anyway
            log.info("worker group shutdown: %s; their processes go with the cluster", exc)
            return
        busy = [a for a, ok in zip(addresses, done, strict=True) if not ok]
        if busy:
            log.info("ranks on %s were busy (a collective with a lost peer?); their processes go with the cluster", busy)

    def discard(self) -> None:
        """Give up a session whose workers were lost: its groups cannot tear down in call order
        (a rank is gone), so their processes go with the cluster; on an external scheduler the
        workers are replaced through their nannies. Then close as :meth:`close` does."""
        self.groups.clear()
        try:
            if self.cluster is None and self.client is not None:
                self.client.restart(timeout=self.startup_timeout_s)
        finally:
            self.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _left(deadline: float, cap: float) -> float:
    """Seconds to give the next shutdown stage: at most ``cap``, at least a short grace."""
    return max(0.5, min(cap, deadline - time.monotonic()))


def _bounded(client: Any, fn: Any, timeout: float, *, nanny: bool = False) -> None:
    """``client.run(fn)`` on every worker (``nanny``: every nanny), given up after ``timeout`` seconds."""
    from distributed.utils import sync

    sync(client.loop, client._run, fn, wait=True, nanny=nanny, callback_timeout=timeout)


def _prepare_nanny_exit(dask_worker: Any) -> None:
    """The nanny's part of a cluster shutdown (distributed's own ``close_gracefully``): its worker
    exiting is not restarted. Without it, a worker that exits before the cluster closes it comes
    back, dials a scheduler that is closing and logs TLS and heartbeat errors after a run that
    succeeded."""
    dask_worker.close_gracefully(reason="flowrl-session-close")


async def _prepare_worker_exit(dask_worker: Any) -> None:
    """Stop the worker's heartbeat, close the client that graph nodes opened inside this worker, then collect garbage and
    freeze the rest: interpreter shutdown with torch loaded otherwise spends seconds in its final
    collection and the nanny kills the process after 4 s (seen on the controller worker)."""
    import gc

    # no more heartbeats: the scheduler is about to close, and a heartbeat racing its close logs
    # "Failed to communicate with scheduler during heartbeat" with a CommClosedError traceback
    heartbeat = getattr(dask_worker, "periodic_callbacks", {}).get("heartbeat")
    if heartbeat is not None:
        heartbeat.stop()
    client = getattr(dask_worker, "_client", None)
    if client is not None:
        result = client.close()
        if hasattr(result, "__await__"):
            await result
    gc.collect()
    gc.freeze()

"""Iteration graphs computed in the driver process (``cluster.controller=driver``).

The default controller is a worker process of the cluster: ``client.compute`` sends each graph
to the scheduler, which runs its nodes there. Every node mostly waits on rank actors, so on one
machine the scheduler's part is pure latency: the graph's trip to the scheduler, a hop per edge,
and the result's trip back (measured: about a third of a 0.09 s step at the smallest benchmark
cell). Here the same graph runs on Dask's threaded scheduler in the driver: its nodes call the
rank actors directly (client to worker, as a node on the controller worker does) and no task
crosses the scheduler.

:meth:`LocalGraphs.submit` returns one :class:`LocalFuture` per output, resolved the moment its
node finishes (the step's result does not wait for the weight sync after it), so the driver
code is the same as with distributed futures. A graph gets a thread of its own and a node pool
of its own: a graph whose nodes wait for an earlier graph's calls (the ranks' reserved order)
never holds a thread that earlier graph needs.
"""

from __future__ import annotations

import itertools
import queue
import threading
from concurrent.futures import Executor, Future
from typing import Any

NODE_THREADS = 8
"""Node threads per graph: more than an iteration's widest layer (generation, reference and
old log-probs side by side)."""
RUNNER_THREADS = 32
"""Graphs that may be in flight at once (each waits for its nodes on a thread of its own)."""


class LocalFuture:
    """A graph output computing in the driver: the part of ``distributed.Future`` the run uses."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._future: Future = Future()

    def result(self, timeout: float | None = None) -> Any:
        return self._future.result(timeout=timeout)

    def done(self) -> bool:
        return self._future.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._future.exception(timeout=timeout)

    def cancel(self) -> bool:
        """Nothing to stop: a running node ends with its actor calls (each has its timeout)."""
        return False

    def release(self) -> None:
        """Nothing held elsewhere (distributed futures release the scheduler's copy)."""


class _DaemonPool(Executor):
    """A fixed set of daemon threads running submitted calls (what ``dask.threaded.get`` takes
    as its pool). Daemon: a node still waiting on an actor when the interpreter exits does not
    hold the exit (``ThreadPoolExecutor``'s threads are joined at exit)."""

    def __init__(self, num_threads: int, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._max_workers = num_threads  # read by dask.threaded.get
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(num_threads)]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - the caller gets it from the future
                future.set_exception(exc)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for t in self._threads:
                t.join()


class LocalGraphs:
    """Runs delayed graphs on Dask's threaded scheduler, one runner thread per graph."""

    def __init__(self, node_threads: int = NODE_THREADS) -> None:
        self.node_threads = node_threads
        self._runners = _DaemonPool(RUNNER_THREADS, "flowrl-graph")
        self._ids = itertools.count()
        self._idle: list[_DaemonPool] = []  # node pools of finished graphs, reused
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, outputs: list[Any], known: dict[str, Any] | None = None) -> list[LocalFuture]:
        """Start computing ``outputs`` (dask delayed objects, sharing nodes); one future each.
        ``known``: values of keys the graph refers to without computing them (the rank actors'
        handles: a node's ``WorkerGroup`` names each actor by its key)."""
        from dask._task_spec import DataNode
        from dask.highlevelgraph import HighLevelGraph

        if self._closed:
            raise RuntimeError("the session is closed: no graph can run")
        graph = dict(HighLevelGraph.merge(*[o.__dask_graph__() for o in outputs]))
        for key, value in (known or {}).items():
            graph.setdefault(key, DataNode(key, value))
        futures = [LocalFuture(o.key) for o in outputs]
        self._runners.submit(self._run, graph, futures)
        return futures

    def _run(self, graph: dict, futures: list[LocalFuture]) -> None:
        import dask.threaded
        by_key: dict[Any, list[LocalFuture]] = {}
        for f in futures:
            by_key.setdefault(f.key, []).append(f)
        lock = threading.Lock()

        def resolve(key: Any, result: Any, *_: Any) -> None:  # posttask: outputs as soon as they finish
            with lock:
                for f in by_key.pop(key, ()):
                    f._future.set_result(result)

        pool = self._take_pool()
        try:
            dask.threaded.get(graph, list(by_key), pool=pool, callbacks=[(None, None, None, resolve, None)])
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on an output
            with lock:
                pending = [f for fs in by_key.values() for f in fs]
                by_key.clear()
            for f in pending:
                f._future.set_exception(exc)
        finally:
            with self._lock:
                self._idle.append(pool)

    def _take_pool(self) -> _DaemonPool:
        """A node pool no running graph holds. Pools (and their threads) are reused: a new
        thread per node would pay torch's and OpenMP's per-thread set-up in every step."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _DaemonPool(self.node_threads, f"flowrl-node{next(self._ids)}")

    def close(self) -> None:
        """No new graphs; running ones end with their actor calls (not waited for)."""
        self._closed = True
        self._runners.shutdown(wait=False)
        with self._lock:
            idle, self._idle = self._idle, []
        for pool in idle:
            pool.shutdown(wait=False)

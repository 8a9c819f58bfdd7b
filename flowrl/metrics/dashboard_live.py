"""The live dashboard server's work off its event loop (issue 39: the server answers while it builds).

Building a session's page (its Bokeh models: about a second at 1,000 steps), the figures sent
after its first paint (seconds) and re-reading the run's files run in worker threads
(:class:`Worker`): one builds the pages of new sessions (:data:`FIRST_PAGE`) and then the spare
page kept for the next one (:data:`SPARE`), the other the figures of open pages and their
re-reads (:data:`FIGURES`), so a new session never waits behind another's figures. The event
loop only attaches what the workers built, under the document's lock
(``doc.add_next_tick_callback``), a batch of figures at a time, so it answers other requests
(another session's page, a plain GET) meanwhile.

Models built off the loop are new and in no document: Bokeh locks documents, not models. The
page's own Python state (its figure cache, its readers) is guarded by ``Dashboard.lock``: the
worker holds it while it builds or re-reads, the loop only tries it and comes back later.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from functools import partial
from typing import Any

__all__ = ["FIGURES", "FIRST_PAGE", "SPARE", "Worker", "batched", "build_figures", "filter_shows", "keep_fresh"]
log = logging.getLogger(__name__)

FIRST_PAGE, FIGURES, SPARE = 0, 1, 2
#: Seconds of figure building per batch the loop attaches (each attach walks the page's models once).
BATCH_S = 0.15
#: Milliseconds before the loop tries again a change the worker's lock held off.
RETRY_MS = 50


class Worker:
    """One daemon thread running submitted functions, lowest ``priority`` first (then in order);
    :meth:`submit` returns an asyncio future of the result for the calling loop."""

    def __init__(self, name: str = "flowrl-dashboard") -> None:
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, priority: int, fn: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put((priority, next(self._order), fn, loop, future))
        return future

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop after the work queued before (a thread is not interruptible); waits ``timeout_s`` at most."""
        self._queue.put((-1, next(self._order), None, None, None))
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            _, _, fn, loop, future = self._queue.get()
            if fn is None:
                return
            try:
                result, error = fn(), None
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def build_figures(dash: Any, worker: Worker, doc: Any, yield_to: Any = None) -> None:
    """Build ``dash``'s deferred figures in ``worker``, a batch at a time, and attach each batch
    on ``doc``'s loop (``Dashboard.document``'s ``start``; called once the browser drew the page).
    The worker builds the next batch while the loop attaches one; after each attach (which walks
    the page's models and serializes the new ones: a good part of a second on a busy machine) the
    loop is left to other work for as long as the attach took, so requests are answered between
    attaches, not after all of them. While ``yield_to()`` is true (another browser waits for its
    first page) neither a batch is started nor one attached: that page's build has the
    interpreter to itself (the threads share one GIL) and the loop is free to send it."""
    from bokeh.document import without_document_lock

    async def others_first() -> None:
        while yield_to is not None and yield_to():
            await asyncio.sleep(RETRY_MS / 1000)

    @without_document_lock
    async def run() -> None:
        loop = asyncio.get_running_loop()
        await others_first()
        next_batch = worker.submit(FIGURES, partial(dash.build_batch, BATCH_S))
        while True:
            built = await next_batch
            if not built or doc.session_context is None:
                return
            await others_first()
            next_batch = worker.submit(FIGURES, partial(dash.build_batch, BATCH_S))
            attached = loop.create_future()
            doc.add_next_tick_callback(partial(_attach, dash, built, attached))
            await asyncio.sleep(await attached)

    doc.add_next_tick_callback(run)


def _attach(dash: Any, built: list, attached: asyncio.Future) -> None:
    start = time.perf_counter()
    try:
        dash.attach_batch(built)
    finally:
        attached.set_result(time.perf_counter() - start)


def keep_fresh(dash: Any, worker: Worker, doc: Any, interval_s: float) -> None:
    """Every ``interval_s``, re-read ``dash``'s files in ``worker`` and show what changed on the
    loop (``Dashboard.refresh`` then ``Dashboard.update``); one re-read at a time."""
    from bokeh.document import without_document_lock

    busy: list[bool] = []

    def show(found: list) -> None:
        if not dash.lock.acquire(blocking=False):  # the worker is building this page's figures
            doc.add_timeout_callback(partial(show, found), RETRY_MS)
            return
        try:
            dash.update(found)
        finally:
            dash.lock.release()
            busy.clear()

    @without_document_lock
    async def tick() -> None:
        if busy:
            return
        busy.append(True)
        try:
            found = await worker.submit(FIGURES, dash.refresh)
        except Exception:  # noqa: BLE001 - a file read failed: try again next tick
            log.exception("re-reading %s failed", [str(r.run_dir) for r in dash.readers])
            busy.clear()
            return
        doc.add_next_tick_callback(partial(show, found))

    doc.add_periodic_callback(tick, int(interval_s * 1000))


@contextlib.contextmanager
def batched(doc: Any) -> Any:
    """Changes of ``doc`` (None: no document, nothing to do) made in the block, the model graph
    walked once at its end and the changes sent to the browser after that: frozen alone, the
    graph would not know the block's new models yet, and every change referring to one would
    send the model whole again."""
    if doc is None:
        yield
        return
    doc.hold("combine")
    try:
        with doc.models.freeze():
            yield
    finally:
        doc.unhold()


def filter_shows(fig: Any, text: str) -> bool:
    """Whether the metric filter (lower-cased ``text``) shows ``fig``, as ``FILTER_JS`` decides:
    an all-metrics figure (``metric:<key>``) whose key contains the text; any other figure."""
    return not fig.name.startswith("metric:") or text in fig.name[len("metric:"):].lower()

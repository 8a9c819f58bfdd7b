"""The dashboard's entry points: a self-contained HTML file of one or several runs
(:func:`export_html`) and the live Bokeh server bound to 127.0.0.1 (:func:`make_server`,
:func:`serve`). The page itself is :class:`flowrl.metrics.dashboard.Dashboard`."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

from flowrl.comm import free_port
from flowrl.metrics.dashboard import Dashboard
from flowrl.metrics.dashboard_live import FIRST_PAGE, SPARE, Worker, build_figures, keep_fresh
from flowrl.metrics.run_reader import RunReader

__all__ = ["export_html", "make_server", "serve"]
log = logging.getLogger(__name__)
#: First pages kept built for the next sessions: a reload or a second browser while a page's
#: figures are built takes one at once (building one takes a second or more at 1,000 steps).
#: Four hold a burst of a new client every 0.5 s (the render benchmark's probes) under 0.4 s at
#: 1,000 steps; with two, the third of a burst waited for a page built anew (1.1 s once in 15).
SPARES = 4


def export_html(run_dir: str | Path | list, out: str | Path, *, max_samples: int = 64) -> Path:
    """Write the dashboard of a run (or several, overlaid) as one self-contained HTML file
    (BokehJS inlined, no server)."""
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    dash = Dashboard(run_dir, max_samples=max_samples)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = dash.document()
    out.write_text(file_html(doc, resources=INLINE, title=doc.title))
    return out


def make_server(run_dir: str | Path | list, *, port: int = 5006, interval_s: float = 2.0, max_samples: int = 64,
                on_progress: Any = None) -> Any:
    """A Bokeh server on 127.0.0.1:``port`` (0: a free one) serving the live dashboard at ``/``;
    every browser session re-reads the run directories every ``interval_s``. Not started.

    The server answers while it builds (:mod:`flowrl.metrics.dashboard_live`): a session's page
    is built in a worker thread while the session is created (the loop serves other requests
    meanwhile) and only attached on the loop; so are the figures built after its first paint
    (:meth:`Dashboard.document`) and every re-read of the files. The readers of all sessions
    share what they parsed (:mod:`flowrl.metrics.run_reader`). The server keeps the first pages
    of the next :data:`SPARES` sessions built (spares, brought up to date when a session takes
    one, and built again in the page worker), and loads
    what every session needs before it accepts (:func:`_warm_up`: seconds for a long run, said
    first to ``on_progress`` if given), so the page is quick once the URL is out."""
    from bokeh.server.server import Server

    runs = list(run_dir) if isinstance(run_dir, (list, tuple)) else [run_dir]
    if interval_s <= 0:
        raise ValueError(f"interval_s={interval_s} must be > 0; fix: use e.g. 2")
    readers = [RunReader(r, max_samples=max_samples) for r in runs]  # fail now on a bad directory, not per session
    if on_progress is not None:
        on_progress("flowrl dashboard: reading the run and building its first page (seconds for a long run) ...")
    pages = _Pages(runs, max_samples, interval_s, spare=_warm_up(readers))
    port = port or free_port()
    origins = [f"127.0.0.1:{port}", f"localhost:{port}"]
    return Server({"/": pages.application()}, address="127.0.0.1", port=port,
                  allow_websocket_origin=origins, num_procs=1)


class _Pages:
    """The sessions' pages: built in the worker (the spare if there is one, else a new page) while
    Bokeh creates the session, attached to its document on the loop."""

    def __init__(self, runs: list, max_samples: int, interval_s: float, spare: Dashboard) -> None:
        self.runs, self.max_samples, self.interval_s = runs, max_samples, interval_s
        self.worker = Worker()  # the open pages' figures and re-reads
        self.page_worker = Worker("flowrl-dashboard-pages")  # new sessions' pages: never behind figures
        self.spare = [spare]
        self.ready: dict[str, Dashboard] = {}  # session id -> its page, between its creation and its document
        self.refills = 0  # refill jobs queued or running (counted on the loop)
        self.waiting = 0  # sessions waiting for their first page (counted on the loop; read by build_figures)

    def new_page(self) -> Dashboard:
        dash = Dashboard(self.runs, max_samples=self.max_samples, live=True, defer=True)
        check_page(dash)
        return dash

    def take(self) -> Dashboard:
        """(In the worker.) The spare brought up to date, else a new page."""
        if self.spare:
            dash = self.spare.pop()
            dash.update()  # what the run wrote since the spare was built
            return dash
        return self.new_page()

    def refill(self) -> None:
        """(In the worker, after the sessions' work.) A spare for a next session, if one is missing."""
        if len(self.spare) < SPARES:
            self.spare.append(self.new_page())

    def _refilled(self, future: Any) -> None:
        """(On the loop.) A refill ended; a failed one is logged (the next session builds its page)."""
        self.refills -= 1
        if not future.cancelled() and future.exception() is not None:
            log.error("building a spare dashboard page failed", exc_info=future.exception())

    def take_into(self, doc: Any) -> Dashboard:
        """(In the worker.) A page (:meth:`take`) made the root of ``doc``, the session's document
        that Bokeh has created but not yet served: adding the root walks the page's models (0.1 s
        at 1,000 steps), time the loop would otherwise spend while every other request waits."""
        dash = self.take()
        dash.document(doc, start=self._figures_of(dash))
        return dash

    async def on_session_created(self, context: Any) -> None:
        # the session's document: created by Bokeh for this session, read by no one until the
        # session exists (after this hook), so the worker may fill it (BokehSessionContext keeps it
        # as ``_document``; Bokeh >= 3.4)
        doc = getattr(context, "_document", None)
        job = self.take if doc is None else partial(self.take_into, doc)
        self.waiting += 1
        try:
            self.ready[context.id] = (await self.page_worker.submit(FIRST_PAGE, job), doc is not None)
        finally:
            self.waiting -= 1
        for _ in range(SPARES - len(self.spare) - self.refills):  # one page per job: a session never waits for two
            self.refills += 1
            self.page_worker.submit(SPARE, self.refill).add_done_callback(self._refilled)

    def _figures_of(self, dash: Dashboard) -> Any:
        """The ``start`` of ``dash``'s document: its deferred figures, after the pages others wait for."""
        return lambda doc: build_figures(dash, self.worker, doc, yield_to=lambda: self.waiting > 0)

    def make_doc(self, doc: Any) -> None:
        dash, filled = self.ready.pop(doc.session_context.id)
        if not filled:
            dash.document(doc, start=self._figures_of(dash))
        keep_fresh(dash, self.worker, doc, self.interval_s)

    def application(self) -> Any:
        from bokeh.application import Application
        from bokeh.application.handlers.function import FunctionHandler

        pages = self

        class Handler(FunctionHandler):
            async def on_session_created(self, context: Any) -> None:
                await pages.on_session_created(context)

            async def on_session_destroyed(self, context: Any) -> None:
                pages.ready.pop(context.id, None)

        class App(Application):
            def initialize_document(self, doc: Any) -> None:
                """The handlers only: the page was validated in the worker (:func:`check_page`)."""
                for handler in self._handlers:
                    handler.modify_document(doc)

        return App(Handler(self.make_doc))


def check_page(dash: Dashboard) -> None:
    """Bokeh's validation of a document, on the page's models (in the worker, not on the loop:
    about 0.3 s at 1,000 steps); its warnings are logged as Bokeh logs them."""
    from bokeh.core.validation import check_integrity, process_validation_issues

    process_validation_issues(check_integrity(dash.layout.references()))


def _warm_up(readers: list[RunReader]) -> Dashboard:
    """Load once, before the server accepts, what every session needs and the process keeps: the
    runs' tokenizers (transformers' import: seconds), the Parquet reader's modules (pyarrow.dataset,
    pandas) and Bokeh's per-class caches, by building a session's first page (returned: the
    first spare). Else the first browser waits about 5 s more than the next ones."""
    for reader in readers:
        reader.load_tokenizer()  # before a run has written a step's Parquet too
    dash = Dashboard(readers, live=True, defer=True)
    check_page(dash)
    return dash


def serve(run_dir: str | Path | list, *, port: int = 5006, interval_s: float = 2.0, max_samples: int = 64,
          on_ready: Any = print) -> None:
    """Serve until interrupted; ``on_ready`` gets a line as the page is being built, then the line with the URL."""
    server = make_server(run_dir, port=port, interval_s=interval_s, max_samples=max_samples, on_progress=on_ready)
    server.start()
    runs = run_dir if isinstance(run_dir, (list, tuple)) else [run_dir]
    shown = str(runs[0]) if len(runs) == 1 else f"{len(runs)} runs"
    on_ready(f"flowrl dashboard for {shown}: http://127.0.0.1:{server.port}/ (Ctrl-C to stop)")
    try:
        server.io_loop.start()
    finally:
        server.stop()

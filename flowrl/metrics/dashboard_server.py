"""The dashboard's entry points: a self-contained HTML file of one or several runs
(:func:`export_html`) and the live Bokeh server bound to 127.0.0.1 (:func:`make_server`,
:func:`serve`). The page itself is :class:`flowrl.metrics.dashboard.Dashboard`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowrl.comm import free_port
from flowrl.metrics.dashboard import Dashboard
from flowrl.metrics.run_reader import RunReader

__all__ = ["export_html", "make_server", "serve"]
#: Seconds after a session opened before the server builds the next session's first page.
SPARE_AFTER_S = 10.0


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


def make_server(run_dir: str | Path | list, *, port: int = 5006, interval_s: float = 2.0, max_samples: int = 64) -> Any:
    """A Bokeh server on 127.0.0.1:``port`` (0: a free one) serving the live dashboard at ``/``;
    every browser session re-reads the run directories every ``interval_s``. Not started.

    First render: a session's first page carries the header, the overview and the step section;
    the other figures are built once the browser has drawn it (:meth:`Dashboard.document`). The
    server keeps that first page of the next session built (a spare, brought up to date with
    :meth:`Dashboard.update` when a browser takes it), and loads what every session needs before
    it accepts (:func:`_warm_up`): a browser then waits for none of it."""
    from bokeh.application import Application
    from bokeh.application.handlers.function import FunctionHandler
    from bokeh.server.server import Server
    from tornado.ioloop import IOLoop

    runs = list(run_dir) if isinstance(run_dir, (list, tuple)) else [run_dir]
    if interval_s <= 0:
        raise ValueError(f"interval_s={interval_s} must be > 0; fix: use e.g. 2")
    readers = [RunReader(r, max_samples=max_samples) for r in runs]  # fail now on a bad directory, not per session
    spare = [_warm_up(readers)]

    def new_page() -> Dashboard:
        return Dashboard(runs, max_samples=max_samples, live=True, defer=True)

    def refill() -> None:
        if not spare:
            spare.append(new_page())

    def make_doc(doc: Any) -> None:
        if spare:
            dash = spare.pop()
            dash.update()  # what the run wrote since the spare was built
        else:
            dash = new_page()
        dash.document(doc)
        doc.add_periodic_callback(dash.update, int(interval_s * 1000))
        # the next spare once this session's page has settled (its figures are built meanwhile)
        IOLoop.current().call_later(SPARE_AFTER_S, refill)

    port = port or free_port()
    origins = [f"127.0.0.1:{port}", f"localhost:{port}"]
    return Server({"/": Application(FunctionHandler(make_doc))}, address="127.0.0.1", port=port,
                  allow_websocket_origin=origins, num_procs=1)


def _warm_up(readers: list[RunReader]) -> Dashboard:
    """Load once, before the server accepts, what every session needs and the process keeps: the
    runs' tokenizers (transformers' import: seconds), the Parquet reader's modules (pyarrow.dataset,
    pandas) and Bokeh's per-class caches, by building a session's first page (returned: the
    first spare). Else the first browser waits about 5 s more than the next ones."""
    for reader in readers:
        reader.load_tokenizer()  # before a run has written a step's Parquet too
    return Dashboard(readers, live=True, defer=True)


def serve(run_dir: str | Path | list, *, port: int = 5006, interval_s: float = 2.0, max_samples: int = 64,
          on_ready: Any = print) -> None:
    """Serve until interrupted; ``on_ready`` gets the line with the URL."""
    server = make_server(run_dir, port=port, interval_s=interval_s, max_samples=max_samples)
    server.start()
    runs = run_dir if isinstance(run_dir, (list, tuple)) else [run_dir]
    shown = str(runs[0]) if len(runs) == 1 else f"{len(runs)} runs"
    on_ready(f"flowrl dashboard for {shown}: http://127.0.0.1:{server.port}/ (Ctrl-C to stop)")
    try:
        server.io_loop.start()
    finally:
        server.stop()

"""The per-step dashboard of a run directory (Bokeh): ``flowrl dashboard RUN_DIR``.

One page, top to bottom:

- a header: run directory, model, algorithm, training steps so far, and on a live page the link
  to the Dask dashboard while it answers (the run recorded one in ``run_info.json``, and its
  cluster still runs; an export links nothing);
- health: every check's last result, ok / warn / failed / n/a / off, a failure with its message
  (``trainer.checks``, :mod:`flowrl.metrics.dashboard_health`);
- overview curves (reward, KL, entropy, clip fraction, response length, throughput);
- the chosen step: a Gantt of its graph nodes (``timeline.jsonl``) and a table of sampled
  prompts / responses / rewards from ``experience/step_XXXXXX.parquet``;
- throughput (``perf/*``) and reshard (``reshard/*``) panels;
- a curve for every key of ``metrics.jsonl``, in sections as verl groups them (``groups.py``),
  with a filter by name.

First render: the page paints the header, the overview and the step section first; the figures
of the throughput and reshard panels and of the all-metrics sections (most of the page's figures)
are attached after that first paint, a panel or section per browser task (:data:`ATTACH_JS` on
the document's ``document_ready``, :meth:`Dashboard.document`), so the page is readable and
answers input while they draw. A live server's session goes further (``defer``): its first page
carries no figure of those panels at all (building them takes seconds at 1,000 steps); the server
builds them after the browser reports the page drawn (Bokeh's ``DocumentReady``), off its event
loop, a batch of panes at a time (:mod:`flowrl.metrics.dashboard_live`), and the browser
attaches each pane as it arrives, the metric filter applied (:data:`LIVE_ATTACH_JS`). Figures
sit in wrapping :class:`bokeh.models.Pane` s, not Bokeh layouts: each figure is then its own
layout root, so attaching a section lays out its figures only (in a Bokeh row any change lays
out every figure of the page again). The metric filter (:data:`FILTER_JS`) takes the figures it
hides out of their pane, so they cost nothing until they are shown again.

Several runs on one page (``flowrl dashboard runA runB``, or a directory of runs): each metric's
figure overlays a line per run, with a legend; the step section shows the run chosen in its
``run`` selector. Every figure follows one EMA smoothing slider and has a log-scale toggle in its
toolbar (:mod:`flowrl.metrics.dashboard_figures`).

The same Bokeh document serves three ways: live from a Bokeh server bound to 127.0.0.1
(:func:`flowrl.metrics.dashboard_server.serve`, re-reading the files every ``interval_s``), as a static self-contained HTML file
(:func:`flowrl.metrics.dashboard_server.export_html`, BokehJS inlined, opens from ``file://``), and inline in Jupyter
(``Dashboard(run_dir).show_in_notebook()``, BokehJS inlined too). The step selector works in all three: it runs
in the browser (a ``CustomJS`` that copies the chosen step's rows into the shown sources).
"""

from __future__ import annotations

import html
import threading
from pathlib import Path
from typing import Any

import numpy as np

from flowrl.metrics.dashboard_figures import FigureMaker, RunSource, flat_span, run_color, stable_color
from flowrl.metrics.dashboard_deferred import DeferredPanes
from flowrl.metrics.dashboard_health import health_html, run_health
from flowrl.metrics.dashboard_js import (ATTACH_JS, FILTER_JS, FIRST_PAINT_JS, LIVE_ATTACH_JS, PICK_STEP_JS,
                                         RUN_STEPS_JS, SHOW_SAMPLE_JS)
from flowrl.metrics.dashboard_step import (NODE_ORDER, gantt, header_html, samples_note, samples_table,
                                           timeline_arrays, timeline_columns)
from flowrl.metrics.groups import RESHARD_GROUP, THROUGHPUT_GROUP, group_metrics, headline_keys, keys_of
from flowrl.metrics.run_reader import SAMPLE_DATA_COLUMNS, Changes, RunReader, run_labels
from flowrl.metrics.timeline import overlapping_rows

__all__ = ["NODE_ORDER", "Dashboard", "flat_span", "stable_color"]
NO_RESHARD = "no reshard metrics yet"
#: Panels whose figures a lazy page attaches after its first paint (the overview paints first).
LAZY_PANELS = ("throughput", "reshard", "metric")


def grid_layout(keys: list[str]) -> list[tuple[str, list[str]]]:
    """``(panel, keys)`` of each grid of figures the page lays out for ``keys``, in page order
    (as :meth:`Dashboard._build_metric_panels` lays them out; panels without keys left out)."""
    grids = [("overview", headline_keys(keys)), ("throughput", keys_of(THROUGHPUT_GROUP, keys)),
             ("reshard", keys_of(RESHARD_GROUP, keys))]
    grids += [("metric", group_keys) for group_keys in group_metrics(keys).values()]
    return [(panel, grid_keys) for panel, grid_keys in grids if grid_keys]


class Dashboard(DeferredPanes):
    """The dashboard's Bokeh models for one run directory, or several overlaid; :meth:`update`
    re-reads the files and pushes what changed (call it from a server's periodic callback).
    Embed it with :meth:`document` (which attaches the lazy panels after the first paint), or call
    :meth:`attach_all` before showing :attr:`layout` on its own."""

    def __init__(self, run_dir: str | Path | RunReader | list, *, max_samples: int = 64, live: bool = False,
                 lazy: bool = True, defer: bool = False) -> None:
        """``lazy``: the figures of :data:`LAZY_PANELS` are attached in the browser after the first
        paint (:meth:`document` wires it; :meth:`attach_all` attaches them at once). ``defer``
        (a live server's session; implies ``lazy``): those figures are not even built before the
        first page is sent, but by :meth:`build_deferred`, a few panes per call, which
        :meth:`document` runs once the browser has drawn the page."""
        runs = list(run_dir) if isinstance(run_dir, (list, tuple)) else [run_dir]
        if not runs:
            raise ValueError("no run directories; fix: pass at least one trainer.run_dir")
        self.readers = [r if isinstance(r, RunReader) else RunReader(r, max_samples=max_samples) for r in runs]
        self.reader = self.readers[0]
        self.labels = run_labels([r.run_dir for r in self.readers])
        self.live = live
        self.lazy = lazy or defer
        self.defer = defer
        # held by whoever changes the page's Python state off a server's event loop
        # (:mod:`flowrl.metrics.dashboard_live`): a figure build, a re-read of the files
        self.lock = threading.RLock()
        for reader in self.readers:
            reader.refresh()
        if live and not self.several:
            self.reader.check_dask_dashboard()
        self._keys = self._all_keys()
        self._figures: dict[tuple[str, str], Any] = {}
        self._grids: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._titles: dict[str, Any] = {}
        self._section_panes: dict[str, Any] = {}  # group -> Pane(title, grid)
        self._panes: list[tuple[Any, list[Any]]] = []  # each metric figure's pane, and its figures, in page order
        self._pending: dict[tuple[str, tuple[str, ...]], Any] = {}  # deferred panes not built yet, in page order
        # the first page is being built: only its lazy panes start empty (attached after the first
        # paint) or deferred (built after it); panes of keys that appear later show at once
        self._initial = True
        self._make_sources()
        self._make_widgets()
        self._link_step_selector()
        self._fill_timeline()
        self._fill_samples()
        self._set_steps(initial=True)
        self._build_metric_panels()
        self._initial = False
        self._set_header()
        self.layout = self._layout()

    @property
    def several(self) -> bool:
        return len(self.readers) > 1

    def _all_keys(self) -> list[str]:
        return sorted({k for r in self.readers for k in r.metric_keys})

    def _make_sources(self) -> None:
        """The data the figures show: metrics (a source per run; the first is named ``metrics``),
        and the timeline and samples (all steps of all runs, and the chosen step's)."""
        from bokeh.models import ColumnDataSource, DataRange1d

        self.metric_srcs = [ColumnDataSource(self._metric_data(r), name="metrics" if i == 0 else f"metrics:{label}")
                            for i, (r, label) in enumerate(zip(self.readers, self.labels))]
        self.metrics_src = self.metric_srcs[0]
        self.x_range = DataRange1d(name="steps")
        tl_cols = {"run": [], "step": [], "node": [], "start": [], "end": [], "duration": [], "label": [], "color": [],
                   "origin": [], "alpha": []}
        self.tl_all = ColumnDataSource(tl_cols, name="timeline_all")
        self.tl_shown = ColumnDataSource({k: [] for k in tl_cols}, name="timeline_shown")
        empty_samples = {k: [] for k in ("run", *SAMPLE_DATA_COLUMNS)}
        self.smp_all = ColumnDataSource(dict(empty_samples), name="samples_all")
        self.smp_shown = ColumnDataSource(dict(empty_samples), name="samples_shown")

    def _make_widgets(self) -> None:
        """Header, step and run selectors, smoothing slider, Gantt, samples table and the (empty) panels."""
        from bokeh.layouts import column, row
        from bokeh.models import Checkbox, Div, Select, TextInput

        self.header = Div(text="", name="header", sizing_mode="stretch_width")
        self.health = Div(text="", name="health", sizing_mode="stretch_width")  # every check's last result
        self.step_select = Select(title="step", options=[], value="", width=120, name="step_select")
        self.run_select = Select(title="run", options=self.labels, value=self.labels[0], width=260, name="run_select",
                                 visible=self.several)
        self.follow = Checkbox(label="follow the latest step", active=True, visible=self.live)
        self.smoothing = FigureMaker.smoothing_slider()
        self.maker = FigureMaker([RunSource(label, run_color(i), src) for i, (label, src)
                                  in enumerate(zip(self.labels, self.metric_srcs))], self.x_range, self.smoothing)
        self.maker.link_slider()
        self.gantt, self.gantt_note = gantt(self.tl_shown)
        self.table_note = Div(text="", name="samples_note")
        self.table = samples_table(self.smp_shown)
        self.selected_text = Div(text="<i>click a row to read the whole prompt and the response, turn by turn</i>",
                                 name="sample_detail", sizing_mode="stretch_width")
        self.overview = row(name="overview")
        self.throughput = column(name="throughput")
        self.reshard = column(name="reshard")
        self.all_metrics = column(name="all_metrics")
        self.metric_filter = TextInput(title="show metrics whose name contains", placeholder="e.g. actor/ or kl",
                                       width=320, name="metric_filter")

    def _link_step_selector(self) -> None:
        """The browser-side callbacks: the step and run selectors (and new rows) pick the shown
        rows; a clicked sample row shows in full."""
        from bokeh.models import CustomJS

        if self.several:  # first: the chosen run's steps, then the pick below shows one of them
            self.run_select.js_on_change("value", CustomJS(args=dict(select=self.step_select, run_select=self.run_select,
                                                                     tl_all=self.tl_all, smp_all=self.smp_all),
                                                           code=RUN_STEPS_JS))
        callback = CustomJS(args=dict(select=self.step_select, run_select=self.run_select, tl_all=self.tl_all,
                                      tl_shown=self.tl_shown, smp_all=self.smp_all, smp_shown=self.smp_shown,
                                      y_range=self.gantt.y_range, gantt_title=self.gantt.title,
                                      table_note=self.table_note, table=self.table),
                            code=PICK_STEP_JS)
        self.step_select.js_on_change("value", callback)
        self.run_select.js_on_change("value", callback)
        for src in (self.tl_all, self.smp_all):
            src.js_on_change("data", callback)
            src.js_on_change("streaming", callback)
        self.smp_shown.selected.js_on_change("indices", CustomJS(args=dict(src=self.smp_shown, div=self.selected_text),
                                                                 code=SHOW_SAMPLE_JS))
        # the filter walks [section, title, grid] per all-metrics section (the grid's tags: its
        # figures), the attaching every lazy pane (both set by _build_metric_panels)
        self.filter_callback = CustomJS(args=dict(filter=self.metric_filter, sections=[]), code=FILTER_JS)
        self.metric_filter.js_on_change("value_input", self.filter_callback)
        self.all_metrics.js_on_change("children", self.filter_callback)  # new sections (live) come in filtered
        self.attach_callback = CustomJS(args=dict(panes=[]), code=ATTACH_JS)
        # a deferred page: each pane the server fills (its tags) is attached in the browser; panes
        # (set by _build_metric_panels): the deferred ones, all filled = the page is complete
        self.live_attach_callback = CustomJS(args=dict(filter_cb=self.filter_callback, panes=[]), code=LIVE_ATTACH_JS)

    def _layout(self) -> Any:
        from bokeh.layouts import column, row
        from bokeh.models import Div

        def h(text: str) -> Any:
            return Div(text=f"<h2 style='margin:14px 0 2px 0'>{text}</h2>", sizing_mode="stretch_width")

        return column(
            self.header,
            h("Health"), self.health,
            self.smoothing,
            h("Overview"), self.overview,
            h("Step"), row(self.run_select, self.step_select, self.follow),
            self.gantt_note, self.gantt,
            self.table_note, self.table, self.selected_text,
            h("Throughput"), self.throughput,
            h("Reshard"), self.reshard,
            h("All metrics"), self.metric_filter, self.all_metrics,
            name="flowrl_dashboard", sizing_mode="stretch_width",
        )

    # ----------------------------------------------------------------- data -> sources
    def _metric_data(self, reader: RunReader) -> dict[str, Any]:
        """A run's columns over the keys of every run (NaN where it lacks one: each figure draws
        every run's line)."""
        keys = self._all_keys()
        return {k: np.asarray(v, dtype=np.float64) for k, v in reader.metric_columns(keys).items()}

    def _fill_timeline(self) -> None:
        rows = [(label, r) for label, reader in zip(self.labels, self.readers) for r in reader.timeline]
        self.tl_all.data = timeline_arrays(rows)  # arrays: sent as bytes, skipped by Bokeh's model walks
        self.gantt_note.visible = not rows

    def _sample_rows(self, reader: RunReader, label: str, steps: list[int]) -> dict[str, list]:
        samples = reader.samples
        data = {k: [v for s in sorted(steps) for v in samples[s][k]] for k in SAMPLE_DATA_COLUMNS}
        return {"run": [label] * len(data["step"]), **data}

    def _fill_samples(self, new_steps: list[list[int]] | None = None) -> None:
        """All runs' samples (``new_steps`` None), or stream each run's new steps."""
        parts = [self._sample_rows(r, label, sorted(r.samples) if new_steps is None else new_steps[i])
                 for i, (r, label) in enumerate(zip(self.readers, self.labels))]
        data = {k: [v for part in parts for v in part[k]] for k in ("run", *SAMPLE_DATA_COLUMNS)}
        if new_steps is None:
            self.smp_all.data = data
        elif data["step"]:
            self.smp_all.stream(data)

    def _set_steps(self, initial: bool = False) -> None:
        """The step selector's options: the steps of the run shown (with several runs, the chosen
        one's: runs of different lengths, no step without rows), the latest chosen while following."""
        if initial and self.several:  # the first run that has a step, not one still empty
            self.run_select.value = next((label for label, r in zip(self.labels, self.readers) if r.steps),
                                         self.labels[0])
        reader = self.readers[self.labels.index(self.run_select.value)] if self.several else self.reader
        steps = [str(s) for s in reader.steps]
        old = self.step_select.value
        self.step_select.options = steps
        if steps and (initial or self.follow.active or old not in steps):
            value = steps[-1]
        else:
            value = old
        if value != old or initial:
            self.step_select.value = value
            self._pick_in_python(value)

    def _pick_in_python(self, value: str) -> None:
        """The step selector's JS, in Python: the initial (and static) state of the shown
        sources, since browser callbacks run only on changes."""
        step = int(value) if value else None
        run = self.run_select.value if self.several else None
        columns = {k: list(v) for k, v in self.smp_all.data.items()}
        idx = [i for i, s in enumerate(columns["step"]) if s == step and (run is None or columns["run"][i] == run)]
        self.smp_shown.data = {k: [v[i] for i in idx] for k, v in columns.items()}
        self.tl_shown.data = self._timeline_shown(step, run)
        nodes = list(dict.fromkeys(self.tl_shown.data["node"]))
        self.gantt.y_range.factors = list(reversed(nodes)) or ["(none)"]
        n_nodes, n_rows = len(self.tl_shown.data["node"]), len(self.smp_shown.data["step"])
        if step is None:
            self.gantt.title.text = "no steps yet"
            self.table_note.text = "no experience yet"
            return
        self.gantt.title.text = (f"step {step}: graph nodes, seconds since the step was submitted" if n_nodes
                                 else f"step {step}: no timeline rows")
        self.table_note.text = samples_note(step, n_rows, self.smp_shown.data["step_rows"][0] if n_rows else 0)

    def _timeline_shown(self, step: int | None, run: str | None) -> dict[str, list]:
        """The Gantt's rows for ``step`` of ``run`` (None: the only run): its own, then those of
        other steps that ran meanwhile (:func:`overlapping_rows`), fainter."""
        reader = self.readers[self.labels.index(run)] if run is not None else self.reader
        label = run if run is not None else self.labels[0]
        rows = overlapping_rows(reader.timeline, step) if step is not None else []
        return timeline_columns([(label, r) for r in rows], step=step)

    # ----------------------------------------------------------------- panels
    def _curve(self, key: str, panel: str) -> Any:
        """One metric's figure, made once and reused when the panels are laid out again (a new
        key appeared): building a Bokeh figure costs tens of milliseconds."""
        cached = self._figures.get((panel, key))
        if cached is not None:
            return cached
        n_points = max(len(r.metrics) for r in self.readers)
        fig = self._figures[(panel, key)] = self.maker.figure(key, panel, n_points)
        self._set_span(key, fig)
        return fig

    def _set_span(self, key: str, fig: Any) -> None:
        """A series flat in every run gets an axis around its value (:func:`flat_span`), a varying one Bokeh's."""
        values = np.concatenate([np.asarray(src.data.get(key, ()), dtype=np.float64) for src in self.metric_srcs])
        span = flat_span(values)
        fig.y_range.default_span = span if span is not None else 2.0

    def _set_spans(self) -> None:
        for (_, key), fig in self._figures.items():
            self._set_span(key, fig)

    def _grid(self, keys: list[str], panel: str, panes: list[tuple[Any, list[Any]]]) -> Any:
        """Curves of ``keys`` in a wrapping :class:`Pane`, each figure named ``<panel>:<key>``
        (``overview``, ``throughput``, ``reshard``, ``metric`` for the all-metrics sections). The
        pane of a panel in :data:`LAZY_PANELS` starts empty on a lazy page (:data:`ATTACH_JS`
        fills it after the first paint): its ``tags`` hold its figures meanwhile (so they are in the
        document, and the filter reaches them). On a deferred page its figures are not built yet:
        its tags stay empty until :meth:`build_deferred`. Appends the pane and its figures to ``panes``."""
        from bokeh.models import Pane

        cache_key = (panel, tuple(keys))
        pane = self._grids.get(cache_key)
        first = self._initial
        deferred = cache_key in self._pending or (pane is None and self.defer and first and panel in LAZY_PANELS)
        figs = [] if deferred else [self._curve(k, panel) for k in keys]
        if pane is None:  # unchanged sections keep their models: the browser keeps their views
            empty = self.lazy and panel in LAZY_PANELS and first
            # as many figures a line as the window is wide, none clipped
            pane = self._grids[cache_key] = Pane(elements=[] if empty else figs, tags=figs, name=f"grid:{panel}",
                                                 styles={"display": "flex", "flex-wrap": "wrap", "gap": "4px",
                                                         "width": "100%"})
            if deferred:
                self._pending[cache_key] = pane
                pane.js_on_change("tags", self.live_attach_callback)
        panes.append((pane, figs))
        return pane

    def _build_metric_panels(self) -> None:
        from bokeh.models import Div, Pane

        keys = self._all_keys()
        panes: list[tuple[Any, list[Any]]] = []
        head = headline_keys(keys)
        self.overview.children = [self._grid(head, "overview", panes)] if head else [Div(text="<i>no metrics yet</i>")]
        perf = keys_of(THROUGHPUT_GROUP, keys)
        self.throughput.children = [self._grid(perf, "throughput", panes)] if perf else \
            [Div(text="<i>no perf/* metrics yet</i>")]
        reshard = keys_of(RESHARD_GROUP, keys)
        self.reshard.children = [self._grid(reshard, "reshard", panes)] if reshard else \
            [Div(text=f"<i>{NO_RESHARD}</i>", name="reshard_note")]
        sections = []  # [section, title, grid] per all-metrics section
        for group, group_keys in group_metrics(keys).items():
            title = self._titles.get(group)
            if title is None:
                title = self._titles[group] = Div(name=f"group:{group}")
            title.text = f"<h3 style='margin:8px 0 0 0'>{html.escape(group)}/ <small>({len(group_keys)})</small></h3>"
            grid = self._grid(group_keys, "metric", panes)
            # title and grid in a Pane too: the filter hides a section without laying out the page
            section = self._section_panes.get(group)
            if section is None:
                section = self._section_panes[group] = Pane(name=f"section:{group}", styles={"width": "100%"})
                section.js_on_change("elements", self.filter_callback)  # a new grid (live) comes in filtered
            if list(section.elements) != [title, grid]:
                section.elements = [title, grid]
            sections.append([section, title, grid])
        first = self._initial
        self._panes = panes
        if first and self._pending:
            self.live_attach_callback.args = dict(self.live_attach_callback.args, panes=list(self._pending.values()))
        if not first:  # new keys while the page is open: their figures show at once
            self._drop_pending({id(pane) for pane, _ in panes})
            self.attach_all()
        self.all_metrics.children = [section for section, *_ in sections] or [Div(text="<i>no metrics yet</i>")]
        self.filter_callback.args = dict(self.filter_callback.args, sections=sections)
        self.attach_callback.args = dict(panes=[pane for pane, _ in self._panes])
        self._keys = keys

    def _set_header(self) -> None:
        self.header.text = header_html(self.readers, self.labels, live=self.live)
        self.health.text = health_html([run_health(r) for r in self.readers], self.labels)

    def document(self, doc: Any = None, start: Any = None) -> Any:
        """``doc`` (a new Bokeh ``Document`` if None) with the dashboard as its root, and the lazy
        panes filled once the browser has painted it (``document_ready``: :data:`ATTACH_JS`). On a
        deferred page (a server's session), ``start(doc)`` builds their figures then instead
        (:func:`flowrl.metrics.dashboard_live.build_figures`: off the event loop), or without
        ``start`` a few panes per tick of the loop (:meth:`build_deferred`)."""
        from bokeh.document import Document
        from bokeh.events import DocumentReady
        from bokeh.models import CustomJS

        doc = Document() if doc is None else doc
        doc.title = f"flowrl: {', '.join(self.labels)}"
        doc.add_root(self.layout)
        if not self._pending:
            doc.js_on_event("document_ready", self.attach_callback)
            return doc
        doc.js_on_event("document_ready", CustomJS(code=FIRST_PAINT_JS))

        def build_next() -> None:
            if self.build_deferred():
                doc.add_next_tick_callback(build_next)

        started = []

        def on_ready(_: Any) -> None:
            if self._pending and not started:  # once: a reconnected browser reports ready again
                started.append(True)
                if start is not None:
                    start(doc)
                else:
                    doc.add_next_tick_callback(build_next)

        doc.on_event(DocumentReady, on_ready)
        return doc

    def show_in_notebook(self) -> None:
        """Show the dashboard inline in Jupyter, BokehJS inlined (works offline, no CDN)."""
        from bokeh.io import output_notebook, show
        from bokeh.resources import INLINE

        self.attach_all()  # a notebook output has no document_ready to attach them later
        output_notebook(INLINE, hide_banner=True)
        show(self.layout)

    # ----------------------------------------------------------------- live
    def refresh(self) -> list[Changes]:
        """Re-read the run directories (each reader's changes) and build the figures of the
        grids new keys add (:meth:`prebuild`); :meth:`update` shows them. A server calls this
        off its event loop."""
        with self.lock:
            found = [reader.refresh() for reader in self.readers]
            self.prebuild()
        if self.live and not self.several:  # the header's Dask link, while the run's cluster answers
            self.reader.check_dask_dashboard()
        return found

    def prebuild(self) -> None:
        """Build the figures the next :meth:`update` lays out for keys that appeared since the
        page was built (a page opened before the run's first step gets all of them at once: tens
        of figures, a second or more), so the update only attaches them."""
        keys = self._all_keys()
        if keys == self._keys:
            return
        with self.lock:
            for panel, grid_keys in grid_layout(keys):
                if (panel, tuple(grid_keys)) not in self._grids:
                    for key in grid_keys:
                        self._curve(key, panel)

    def update(self, found: list[Changes] | None = None) -> Changes:
        """Push what :meth:`refresh` found (None: re-read the files now); returns the changes (all runs')."""
        found = self.refresh() if found is None else found
        if any(c.new_sample_steps for c in found):
            self._fill_samples([c.new_sample_steps for c in found])
        if any(c.timeline_changed for c in found):
            self._fill_timeline()
        keys = self._all_keys()
        for reader, src, c in zip(self.readers, self.metric_srcs, found):
            if c.metrics_reset or keys != self._keys:
                src.data = self._metric_data(reader)
            elif c.new_metric_rows:
                new = reader.rows_columns(c.new_metric_rows, keys)
                src.stream({k: np.asarray(v, dtype=np.float64) for k, v in new.items()})
        if keys != self._keys:
            self._build_metric_panels()
        if any(c.metrics_reset or c.new_metric_rows for c in found) or keys != self._keys:
            self._set_spans()
        if any(c.any for c in found):
            self._set_steps()
        self._set_header()
        return Changes.merged(found)

"""The per-step dashboard of a run directory (Bokeh): ``flowrl dashboard RUN_DIR``.

One page, top to bottom:

- a header: run directory, model, algorithm, steps so far, link to the Dask dashboard (when the
  run recorded one in ``run_info.json``);
- overview curves (reward, KL, entropy, clip fraction, response length, throughput);
- the chosen step: a Gantt of its graph nodes (``timeline.jsonl``) and a table of sampled
  prompts / responses / rewards from ``experience/step_XXXXXX.parquet``;
- throughput (``perf/*``) and reshard (``reshard/*``) panels;
- a curve for every key of ``metrics.jsonl``, in sections as verl groups them (``groups.py``).

The same Bokeh document serves three ways: live from a Bokeh server bound to 127.0.0.1
(:func:`serve`, re-reading the files every ``interval_s``), as a static self-contained HTML file
(:func:`export_html`, BokehJS inlined, opens from ``file://``), and inline in Jupyter
(``Dashboard(run_dir).show_in_notebook()``, BokehJS inlined too). The step selector works in all three: it runs
in the browser (a ``CustomJS`` that copies the chosen step's rows into the shown sources).
"""

from __future__ import annotations

import html
import math
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from flowrl.comm import free_port
from flowrl.metrics import names
from flowrl.metrics.dashboard_js import FILTER_JS, PICK_STEP_JS, SHOW_SAMPLE_JS, TICK_JS
from flowrl.metrics.groups import RESHARD_GROUP, THROUGHPUT_GROUP, group_metrics, headline_keys, keys_of
from flowrl.metrics.run_reader import SAMPLE_COLUMNS, Changes, RunReader

FIG_W, FIG_H = 330, 210
# The graph nodes of the built-in families, in the order they run: each keeps its colour in every
# run and every step; another node gets one from its name's hash (the same in every run).
NODE_ORDER = ("collect", "gen", "gen_baseline", "val_gen", "reward", "rm_score", "reward_baseline",
              "val_reward", "overlong", "combine_rewards", "old_log_prob", "ref", "values", "kl_in_reward",
              "adv", "rollout_corr", "critic_warmup", "update_critic", "update_actor", "rollout_sleep",
              "val_report")
NO_RESHARD = "no reshard metrics yet"
NO_TIMELINE = "no timeline.jsonl yet (written by flowrl's trainer after each step)"


def stable_color(name: str, order: tuple[str, ...] = ()) -> str:
    """The colour of a node or metric: by its place in ``order``, else by a hash of its name, so
    it is the same in every run, whatever else the run has."""
    from bokeh.palettes import Category20, Category20b

    palette = Category20[20] + Category20b[20]
    index = order.index(name) if name in order else len(order) + zlib.crc32(name.encode())
    return palette[index % len(palette)]


def flat_span(values: Any) -> float | None:
    """The y-range span for a series whose finite values are all equal (10% of the value, so an
    axis around 5e-4 reads 4.75e-4..5.25e-4 rather than -1..1), None for a varying or empty one."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0 or arr.min() != arr.max():
        return None
    return abs(float(arr[0])) * 0.1 or 1.0


def _figure(title: str, *, x_range: Any = None, y_label: str = "", name: str = "") -> Any:
    from bokeh.models import CustomJSTickFormatter, DataRange1d
    from bokeh.plotting import figure

    kwargs = {"x_range": x_range} if x_range is not None else {}
    fig = figure(title=title, width=FIG_W, height=FIG_H, tools="pan,wheel_zoom,box_zoom,reset,save",
                 toolbar_location="above", name=name or None, y_range=DataRange1d(), **kwargs)
    fig.yaxis.formatter = CustomJSTickFormatter(code=TICK_JS)
    fig.title.text_font_size = "9pt"
    fig.xaxis.axis_label = "step"
    fig.yaxis.axis_label = y_label
    fig.xaxis.axis_label_text_font_size = "8pt"
    fig.min_border_left = 40
    return fig


class Dashboard:
    """The dashboard's Bokeh models for one run directory; :meth:`update` re-reads the files
    and pushes what changed (call it from a server's periodic callback)."""

    def __init__(self, run_dir: str | Path | RunReader, *, max_samples: int = 64, live: bool = False) -> None:
        self.reader = run_dir if isinstance(run_dir, RunReader) else RunReader(run_dir, max_samples=max_samples)
        self.live = live
        self.reader.refresh()
        self._keys = self.reader.metric_keys
        self._figures: dict[tuple[str, str], Any] = {}
        self._grids: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._titles: dict[str, Any] = {}
        self._make_sources()
        self._make_widgets()
        self._link_step_selector()
        self._fill_timeline()
        self._fill_samples()
        self._set_steps(initial=True)
        self._build_metric_panels()
        self._set_header()
        self.layout = self._layout()

    def _make_sources(self) -> None:
        """The data the figures show: metrics, and the timeline and samples (all steps, and the
        chosen step's)."""
        from bokeh.models import ColumnDataSource, DataRange1d

        self.metrics_src = ColumnDataSource(self._metric_data(), name="metrics")
        self.x_range = DataRange1d(name="steps")
        tl_cols = {"step": [], "node": [], "start": [], "end": [], "duration": [], "label": [], "color": []}
        self.tl_all = ColumnDataSource(tl_cols, name="timeline_all")
        self.tl_shown = ColumnDataSource({k: [] for k in tl_cols}, name="timeline_shown")
        empty_samples = {k: [] for k in SAMPLE_COLUMNS}
        self.smp_all = ColumnDataSource(dict(empty_samples), name="samples_all")
        self.smp_shown = ColumnDataSource(dict(empty_samples), name="samples_shown")

    def _make_widgets(self) -> None:
        """Header, step selector, Gantt, samples table and the (empty) panels."""
        from bokeh.layouts import column, row
        from bokeh.models import Checkbox, Div, Select, TextInput

        self.header = Div(text="", name="header", sizing_mode="stretch_width")
        self.step_select = Select(title="step", options=[], value="", width=120, name="step_select")
        self.follow = Checkbox(label="follow the latest step", active=True, visible=self.live)
        self.gantt, self.gantt_note = self._gantt()
        self.table_note = Div(text="", name="samples_note")
        self.table = self._table()
        self.selected_text = Div(text="<i>click a row to read the whole prompt and response</i>",
                                 name="sample_detail", sizing_mode="stretch_width")
        self.overview = row(name="overview")
        self.throughput = column(name="throughput")
        self.reshard = column(name="reshard")
        self.all_metrics = column(name="all_metrics")
        self.metric_filter = TextInput(title="show metrics whose name contains", placeholder="e.g. actor/ or kl",
                                       width=320, name="metric_filter")

    def _link_step_selector(self) -> None:
        """The browser-side callbacks: the step selector (and new rows) pick the shown step's
        rows; a clicked sample row shows in full."""
        from bokeh.models import CustomJS

        callback = CustomJS(args=dict(select=self.step_select, tl_all=self.tl_all, tl_shown=self.tl_shown,
                                      smp_all=self.smp_all, smp_shown=self.smp_shown, y_range=self.gantt.y_range,
                                      gantt_title=self.gantt.title, table_note=self.table_note, table=self.table),
                            code=PICK_STEP_JS)
        self.step_select.js_on_change("value", callback)
        for src in (self.tl_all, self.smp_all):
            src.js_on_change("data", callback)
            src.js_on_change("streaming", callback)
        self.smp_shown.selected.js_on_change("indices", CustomJS(args=dict(src=self.smp_shown, div=self.selected_text),
                                                                 code=SHOW_SAMPLE_JS))
        self.metric_filter.js_on_change("value_input", CustomJS(args=dict(panel=self.all_metrics), code=FILTER_JS))

    def _layout(self) -> Any:
        from bokeh.layouts import column, row
        from bokeh.models import Div

        def h(text: str) -> Any:
            return Div(text=f"<h2 style='margin:14px 0 2px 0'>{text}</h2>", sizing_mode="stretch_width")

        return column(
            self.header,
            h("Overview"), self.overview,
            h("Step"), row(self.step_select, self.follow),
            self.gantt_note, self.gantt,
            self.table_note, self.table, self.selected_text,
            h("Throughput"), self.throughput,
            h("Reshard"), self.reshard,
            h("All metrics"), self.metric_filter, self.all_metrics,
            name="flowrl_dashboard", sizing_mode="stretch_width",
        )

    # ----------------------------------------------------------------- data -> sources
    def _metric_data(self) -> dict[str, Any]:
        return {k: np.asarray(v, dtype=np.float64) for k, v in self.reader.metric_columns().items()}

    def _fill_timeline(self) -> None:
        rows = self.reader.timeline
        self.tl_all.data = {
            "step": [r["step"] for r in rows],
            "node": [r["node"] for r in rows],
            "start": [r["start"] for r in rows],
            "end": [r["end"] for r in rows],
            "duration": [r["end"] - r["start"] for r in rows],
            "label": [f"{r['end'] - r['start']:.3g}s" for r in rows],
            "color": [stable_color(r["node"], NODE_ORDER) for r in rows],
        }
        self.gantt_note.visible = not rows

    def _fill_samples(self, steps: list[int] | None = None) -> None:
        samples = self.reader.samples
        if steps is None:
            data = {k: [v for s in sorted(samples) for v in samples[s][k]] for k in SAMPLE_COLUMNS}
            self.smp_all.data = data
        elif steps:
            self.smp_all.stream({k: [v for s in sorted(steps) for v in samples[s][k]] for k in SAMPLE_COLUMNS})

    def _set_steps(self, initial: bool = False) -> None:
        steps = [str(s) for s in self.reader.steps]
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
        for all_src, shown in ((self.tl_all, self.tl_shown), (self.smp_all, self.smp_shown)):
            columns = {k: list(v) for k, v in all_src.data.items()}
            idx = [i for i, s in enumerate(columns["step"]) if s == step]
            shown.data = {k: [v[i] for i in idx] for k, v in columns.items()}
        nodes = list(dict.fromkeys(self.tl_shown.data["node"]))
        self.gantt.y_range.factors = list(reversed(nodes)) or ["(none)"]
        n_nodes, n_rows = len(self.tl_shown.data["node"]), len(self.smp_shown.data["step"])
        if step is None:
            self.gantt.title.text = "no steps yet"
            self.table_note.text = "no experience yet"
            return
        self.gantt.title.text = (f"step {step}: graph nodes, seconds since the step was submitted" if n_nodes
                                 else f"step {step}: no timeline rows")
        self.table_note.text = f"step {step}: {n_rows} samples" if n_rows else f"step {step}: no experience Parquet"

    # ----------------------------------------------------------------- panels
    def _gantt(self) -> tuple[Any, Any]:
        from bokeh.models import Div, FactorRange, HoverTool, LabelSet
        from bokeh.plotting import figure

        fig = figure(title="node timeline", y_range=FactorRange(factors=["(none)"]), height=300,
                     sizing_mode="stretch_width", tools="xpan,xwheel_zoom,reset,save", toolbar_location="above",
                     name="timeline", x_axis_label="seconds since the step was submitted")
        # the colour is a column (stable_color), so nodes that first appear after the page was
        # built get theirs too
        bars = fig.hbar(y="node", left="start", right="end", height=0.6, source=self.tl_shown,
                        fill_color="color", line_color=None, name="timeline_bars")
        fig.add_layout(LabelSet(x="end", y="node", text="label", source=self.tl_shown, x_offset=4, y_offset=-6,
                                text_font_size="8pt"))
        fig.add_tools(HoverTool(renderers=[bars], tooltips=[("node", "@node"), ("start", "@start{0.000}s"),
                                                            ("end", "@end{0.000}s"), ("took", "@duration{0.000}s")]))
        fig.x_range.start = 0
        return fig, Div(text=f"<i>{NO_TIMELINE}</i>", name="timeline_note", visible=False)

    def _table(self) -> Any:
        from bokeh.models import DataTable, NumberFormatter, TableColumn

        widths = {"step": 40, "uid": 60, "group": 45, "data_source": 110, "prompt": 260, "response": 360,
                  "ground_truth": 90, "score": 55, "response_length": 60, "advantage": 70}
        fmt = {"score": NumberFormatter(format="0.000"), "advantage": NumberFormatter(format="0.000")}
        columns = [TableColumn(field=k, title=k.replace("_", " "), width=widths[k], **({"formatter": fmt[k]} if k in fmt else {}))
                   for k in SAMPLE_COLUMNS]
        return DataTable(source=self.smp_shown, columns=columns, height=320, sizing_mode="stretch_width",
                         index_position=None, name="samples", selectable=True)

    def _curve(self, key: str, color: str, panel: str) -> Any:
        """One metric's figure, made once and reused when the panels are laid out again (a new
        key appeared): building a Bokeh figure costs tens of milliseconds."""
        from bokeh.models import HoverTool

        cached = self._figures.get((panel, key))
        if cached is not None:
            return cached
        fig = _figure(key, x_range=self.x_range, name=f"{panel}:{key}")
        line = fig.line("step", key, source=self.metrics_src, line_width=2, color=color)
        fig.scatter("step", key, source=self.metrics_src, size=4, color=color)
        field = f"@{{{key}}}"
        fig.add_tools(HoverTool(renderers=[line], tooltips=[("step", "@step"), (key, field + "{%.4g}")],
                                formatters={field: "printf"}, mode="vline"))
        self._figures[(panel, key)] = fig
        self._set_span(key, fig)
        return fig

    def _set_span(self, key: str, fig: Any) -> None:
        """A flat series gets an axis around its value (:func:`flat_span`), a varying one Bokeh's."""
        span = flat_span(self.metrics_src.data.get(key, ()))
        fig.y_range.default_span = span if span is not None else 2.0

    def _set_spans(self) -> None:
        for (_, key), fig in self._figures.items():
            self._set_span(key, fig)

    def _grid(self, keys: list[str], panel: str) -> Any:
        """Curves of ``keys``, each figure named ``<panel>:<key>`` (``metric`` for the all-metrics
        sections, ``overview``, ``throughput``, ``reshard``)."""
        from bokeh.layouts import row

        cache_key = (panel, tuple(keys))
        if cache_key not in self._grids:  # unchanged sections keep their models: the browser keeps their views
            figs = [self._curve(k, stable_color(k), panel) for k in keys]
            # a wrapping row: as many figures a line as the window is wide, none clipped
            self._grids[cache_key] = row(*figs, sizing_mode="stretch_width", name=f"grid:{panel}",
                                         styles={"flex-wrap": "wrap", "gap": "4px"})
        return self._grids[cache_key]

    def _build_metric_panels(self) -> None:
        from bokeh.models import Div

        keys = self.reader.metric_keys
        head = headline_keys(keys)
        self.overview.children = [self._grid(head, "overview")] if head else [Div(text="<i>no metrics yet</i>")]
        perf = keys_of(THROUGHPUT_GROUP, keys)
        self.throughput.children = [self._grid(perf, "throughput")] if perf else [Div(text="<i>no perf/* metrics yet</i>")]
        reshard = keys_of(RESHARD_GROUP, keys)
        self.reshard.children = [self._grid(reshard, "reshard")] if reshard else [Div(text=f"<i>{NO_RESHARD}</i>", name="reshard_note")]
        sections = []
        for group, group_keys in group_metrics(keys).items():
            title = self._titles.get(group)
            if title is None:
                title = self._titles[group] = Div(name=f"group:{group}")
            title.text = f"<h3 style='margin:8px 0 0 0'>{html.escape(group)}/ <small>({len(group_keys)})</small></h3>"
            sections.append(title)
            sections.append(self._grid(group_keys, "metric"))
        self.all_metrics.children = sections or [Div(text="<i>no metrics yet</i>")]
        self._keys = keys

    def _set_header(self) -> None:
        r = self.reader
        cfg = r.config
        model = (cfg.get("model") or {}).get("path", "?")
        algo = (cfg.get("algorithm") or {}).get("adv_estimator", "?")
        total = (cfg.get("trainer") or {}).get("total_training_steps", "?")
        steps = sorted(r.metrics)
        last = r.metrics[steps[-1]] if steps else {}
        score = last.get(names.SCORE_MEAN)
        link = r.dask_dashboard
        dask = (f"<a href='{html.escape(link)}' target='_blank' id='dask-dashboard'>Dask dashboard</a>" if link
                else "Dask dashboard: not recorded (set cluster.dashboard=true)")
        note = f" &middot; {html.escape(r.tokenizer_note)}" if r.tokenizer_note else ""
        updated = time.strftime("%H:%M:%S") if self.live else "static export " + time.strftime("%Y-%m-%d %H:%M")
        self.header.text = (
            f"<h1 style='margin:4px 0'>flowrl run</h1><div><code>{html.escape(str(r.run_dir))}</code></div>"
            f"<div>model <code>{html.escape(str(model))}</code> &middot; {html.escape(str(algo))} &middot; "
            f"<b>{len(steps)}</b> / {html.escape(str(total))} steps logged"
            + (f" &middot; last {names.SCORE_MEAN} <b>{score:.4f}</b>" if isinstance(score, (int, float)) and math.isfinite(score) else "")
            + f" &middot; {dask} &middot; updated {updated}{note}</div>"
        )

    def show_in_notebook(self) -> None:
        """Show the dashboard inline in Jupyter, BokehJS inlined (works offline, no CDN)."""
        from bokeh.io import output_notebook, show
        from bokeh.resources import INLINE

        output_notebook(INLINE, hide_banner=True)
        show(self.layout)

    # ----------------------------------------------------------------- live
    def update(self) -> Changes:
        """Re-read the run directory and push what changed."""
        changes = self.reader.refresh()
        if changes.new_sample_steps:
            self._fill_samples(changes.new_sample_steps)
        if changes.timeline_changed:
            self._fill_timeline()
        keys = self.reader.metric_keys
        if changes.metrics_reset or keys != self._keys:
            self.metrics_src.data = self._metric_data()
            if keys != self._keys:
                self._build_metric_panels()
        elif changes.new_metric_rows:
            new = self.reader.rows_columns(changes.new_metric_rows)
            self.metrics_src.stream({k: np.asarray(v, dtype=np.float64) for k, v in new.items()})
        if changes.metrics_reset or changes.new_metric_rows or keys != self._keys:
            self._set_spans()
        if changes.any:
            self._set_steps()
        self._set_header()
        return changes


# --------------------------------------------------------------------------- entry points
def export_html(run_dir: str | Path, out: str | Path, *, max_samples: int = 64) -> Path:
    """Write the dashboard as one self-contained HTML file (BokehJS inlined, no server)."""
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    dash = Dashboard(run_dir, max_samples=max_samples)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(file_html(dash.layout, resources=INLINE, title=f"flowrl: {Path(run_dir).name}"))
    return out


def make_server(run_dir: str | Path, *, port: int = 5006, interval_s: float = 2.0, max_samples: int = 64) -> Any:
    """A Bokeh server on 127.0.0.1:``port`` (0: a free one) serving the live dashboard at ``/``;
    every browser session re-reads the run directory every ``interval_s``. Not started."""
    from bokeh.application import Application
    from bokeh.application.handlers.function import FunctionHandler
    from bokeh.server.server import Server

    RunReader(run_dir, max_samples=max_samples)  # fail now on a bad directory, not per session
    if interval_s <= 0:
        raise ValueError(f"interval_s={interval_s} must be > 0; fix: use e.g. 2")

    def make_doc(doc: Any) -> None:
        dash = Dashboard(run_dir, max_samples=max_samples, live=True)
        doc.title = f"flowrl: {Path(run_dir).name}"
        doc.add_root(dash.layout)
        doc.add_periodic_callback(dash.update, int(interval_s * 1000))

    port = port or free_port()
    origins = [f"127.0.0.1:{port}", f"localhost:{port}"]
    return Server({"/": Application(FunctionHandler(make_doc))}, address="127.0.0.1", port=port,
                  allow_websocket_origin=origins, num_procs=1)


def serve(run_dir: str | Path, *, port: int = 5006, interval_s: float = 2.0, max_samples: int = 64,
          on_ready: Any = print) -> None:
    """Serve until interrupted; ``on_ready`` gets the line with the URL."""
    server = make_server(run_dir, port=port, interval_s=interval_s, max_samples=max_samples)
    server.start()
    on_ready(f"flowrl dashboard for {run_dir}: http://127.0.0.1:{server.port}/ (Ctrl-C to stop)")
    try:
        server.io_loop.start()
    finally:
        server.stop()

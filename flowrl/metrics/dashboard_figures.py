"""The dashboard's metric figures: one figure per metric key, a line per run, an EMA smoothing
shared by every figure, and a log-scale toggle in each figure's toolbar.

Smoothing and the log scale run in the browser, as transforms of the plotted columns
(``CustomJSTransform``): the sources keep the logged values (the hover shows them), a moved
slider or a toggled figure redraws from them, and rows the live server streams in are smoothed
as they arrive. In log mode a figure plots ``log10`` of its values (values <= 0 are left out) and
its tick labels read ``10**tick``; its title says ``(log)``.
"""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowrl.metrics.dashboard_js import EMA_JS, LOG_TOGGLE_JS, SMOOTHING_JS, TICK_JS

FIG_W, FIG_H = 330, 210
#: Height of a row of a figure's legend below the plot (several runs), and the width it has.
LEGEND_ROW_H = 16
#: Figures with more points than this per run draw lines only (markers cost render time).
MARKERS_UP_TO = 200
_LOG_ICON = "data:image/svg+xml;base64," + base64.b64encode(
    b"<svg xmlns='http://www.w3.org/2000/svg' width='18' height='18'><text x='0' y='13' font-size='10'"
    b" font-family='sans-serif' font-weight='bold'>log</text></svg>").decode()


def stable_color(name: str, order: tuple[str, ...] = ()) -> str:
    """The colour of a node or metric: by its place in ``order``, else by a hash of its name, so
    it is the same in every run, whatever else the run has."""
    from bokeh.palettes import Category20, Category20b

    palette = Category20[20] + Category20b[20]
    index = order.index(name) if name in order else len(order) + zlib.crc32(name.encode())
    return palette[index % len(palette)]


def run_color(index: int) -> str:
    """The colour of the ``index``-th run of a page with several runs (the same in every figure)."""
    from bokeh.palettes import Category10

    return Category10[10][index % 10]


def legend_rows(labels: list[str], width: int = FIG_W - 50) -> tuple[int, int]:
    """(entries per row, rows) of a horizontal legend of ``labels`` in ``width`` pixels (7pt
    text: about 5 px a character, a glyph and its gaps about 26 px)."""
    entry = 26 + 5 * max(len(label) for label in labels)
    per_row = max(1, min(len(labels), width // entry))
    return per_row, -(-len(labels) // per_row)


def flat_span(values: Any) -> float | None:
    """The y-range span for a series whose finite values are all equal (10% of the value, so an
    axis around 5e-4 reads 4.75e-4..5.25e-4 rather than -1..1), None for a varying or empty one."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0 or arr.min() != arr.max():
        return None
    return abs(float(arr[0])) * 0.1 or 1.0


def ema(values: Any, weight: float) -> np.ndarray:
    """The smoothing the page's slider applies (:data:`EMA_JS`), in Python: TensorBoard's
    debiased exponential moving average over the finite values, NaN kept where a value is
    missing. ``weight`` 0 returns the values."""
    out = np.asarray(values, dtype=np.float64).copy()
    if weight <= 0:
        return out
    last, n = 0.0, 0
    for i, v in enumerate(out):
        if not np.isfinite(v):
            continue
        n += 1
        last = last * weight + (1 - weight) * v
        out[i] = last / (1 - weight**n)
    return out


@dataclass(frozen=True)
class RunSource:
    """One run's metric columns on the page: its label (the legend's entry), colour, source."""

    label: str
    color: str
    source: Any  # ColumnDataSource: step + one column per metric key


class FigureMaker:
    """Makes the metric figures of a page: shared x range, smoothing slider, run sources."""

    def __init__(self, runs: list[RunSource], x_range: Any, smoothing: Any) -> None:
        self.runs = runs
        self.x_range = x_range
        self.smoothing = smoothing  # the Slider every figure's smoothed line follows

    @staticmethod
    def smoothing_slider() -> Any:
        from bokeh.models import Slider

        return Slider(start=0.0, end=0.99, step=0.01, value=0.0, width=320, name="smoothing",
                      title="smoothing (EMA weight, as TensorBoard's; 0: none)")

    def link_slider(self) -> None:
        """A moved slider redraws every run's lines."""
        from bokeh.models import CustomJS

        self.smoothing.js_on_change("value", CustomJS(args=dict(sources=[r.source for r in self.runs]), code=SMOOTHING_JS))

    def figure(self, key: str, panel: str, n_points: int) -> Any:
        """``key``'s figure in ``panel``, named ``<panel>:<key>``: per run a faint raw line and
        the smoothed line (equal while the smoothing is 0), a legend when there are several runs.

        Each glyph is one model: its renderer's selection and mute looks are left to BokehJS
        (``"auto"``), not copies of the glyph as ``figure.line`` makes (nothing on the page selects
        or mutes; two thirds fewer glyph models to build, send and deserialize)."""
        from bokeh.core.properties import value
        from bokeh.models import CustomJSTransform, HoverTool, Legend, LegendItem, Line, Scatter
        from bokeh.transform import transform

        fig = self._blank(key, panel)
        raw_t = CustomJSTransform(args=dict(fig=fig, smoothing=None), v_func=EMA_JS)
        smooth_t = CustomJSTransform(args=dict(fig=fig, smoothing=self.smoothing), v_func=EMA_JS)
        several = len(self.runs) > 1
        hover_lines = []
        for run in self.runs:
            color = run.color if several else stable_color(key)
            src = run.source
            fig.add_glyph(src, Line(x="step", y=transform(key, raw_t), line_width=1, line_color=color, line_alpha=0.25))
            line = fig.add_glyph(src, Line(x="step", y=transform(key, smooth_t), line_width=2, line_color=color),
                                 name=run.label)
            if n_points <= MARKERS_UP_TO and not several:
                fig.add_glyph(src, Scatter(x="step", y=transform(key, raw_t), size=4, line_color=color, fill_color=color))
            hover_lines.append(line)
        field = f"@{{{key}}}"
        fig.add_tools(HoverTool(renderers=hover_lines, tooltips=[("run", "$name"), ("step", "@step"), (key, field + "{%.4g}")]
                                if several else [("step", "@step"), (key, field + "{%.4g}")],
                                formatters={field: "printf"}, mode="vline"))
        if several:  # below the plot, not over the curves; as many rows as the labels need
            per_row, rows = legend_rows([run.label for run in self.runs])
            legend = Legend(items=[LegendItem(label=value(run.label), renderers=[line])
                                   for run, line in zip(self.runs, hover_lines)],
                            orientation="horizontal", ncols=per_row, label_text_font_size="7pt", padding=1,
                            spacing=6, glyph_height=10, glyph_width=14, label_height=10, margin=2, click_policy="hide")
            fig.add_layout(legend, "below")
            fig.height = FIG_H + LEGEND_ROW_H * rows  # the plot keeps its height
        return fig

    def _blank(self, key: str, panel: str) -> Any:
        from bokeh.models import CustomAction, CustomJS, CustomJSTickFormatter, DataRange1d
        from bokeh.plotting import figure

        fig = figure(title=key, width=FIG_W, height=FIG_H, tools="pan,wheel_zoom,box_zoom,reset,save",
                     toolbar_location="above", name=f"{panel}:{key}", y_range=DataRange1d(), x_range=self.x_range)
        fig.yaxis.formatter = CustomJSTickFormatter(args=dict(fig=fig), code=TICK_JS)
        fig.title.text_font_size = "9pt"
        fig.xaxis.axis_label = "step"
        fig.xaxis[0].ticker.min_interval = 1  # steps are whole: no 0.5 ticks on a short run
        fig.xaxis.axis_label_text_font_size = "8pt"
        fig.min_border_left = 40
        toggle = CustomAction(icon=_LOG_ICON, description="log scale on/off", name=f"log:{panel}:{key}",
                              callback=CustomJS(args=dict(fig=fig, title=key, sources=[r.source for r in self.runs]),
                                                code=LOG_TOGGLE_JS))
        fig.add_tools(toggle)
        return fig

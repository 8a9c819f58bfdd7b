"""The dashboard's step section and header: the Gantt of a step's graph nodes, the table of its
sampled rows, the timeline rows as the Gantt's columns, and each run's header line
(:class:`flowrl.metrics.dashboard.Dashboard` lays them out)."""

from __future__ import annotations

import html
import math
import time
from typing import Any

from flowrl.metrics import names
from flowrl.metrics.dashboard_figures import run_color, stable_color
from flowrl.metrics.run_reader import SAMPLE_COLUMNS, RunReader

# The graph nodes of the built-in families, in the order they run: each keeps its colour in every
# run and every step; another node gets one from its name's hash (the same in every run).
NODE_ORDER = ("collect", "gen", "gen_baseline", "val_gen", "reward", "rm_score", "reward_baseline",
              "val_reward", "overlong", "combine_rewards", "old_log_prob", "ref", "values", "kl_in_reward",
              "adv", "rollout_corr", "critic_warmup", "update_critic", "update_actor", "rollout_sleep",
              "val_report")
NO_TIMELINE = "no timeline.jsonl yet (written by flowrl's trainer after each step)"


def timeline_columns(rows: list[tuple[str, dict]], step: int | None = None) -> dict[str, list]:
    """The Gantt's columns for ``(run label, timeline row)`` pairs; with ``step``, rows of other
    steps (that ran meanwhile, named ``node (step k)``) fainter."""
    return {
        "run": [label for label, _ in rows],
        "step": [r["step"] for _, r in rows],
        "node": [r["node"] for _, r in rows],
        "start": [r["start"] for _, r in rows],
        "end": [r["end"] for _, r in rows],
        "duration": [r["end"] - r["start"] for _, r in rows],
        "label": [f"{r['end'] - r['start']:.3g}s" for _, r in rows],
        "color": [stable_color(r["node"].split(" (step ")[0], NODE_ORDER) for _, r in rows],
        "origin": [math.nan if r.get("origin") is None else r["origin"] for _, r in rows],
        "alpha": [1.0 if step is None or r["step"] == step else 0.45 for _, r in rows],
    }


def timeline_arrays(rows: list[tuple[str, dict]]) -> dict[str, Any]:
    """:func:`timeline_columns` as numpy arrays (strings as object arrays): Bokeh sends numbers
    as bytes, and its walks of the document's models do not descend into arrays (a 1,000-step
    run's timeline is 60,000 list items to visit on every change of the page)."""
    import numpy as np

    out: dict[str, Any] = {}
    for key, values in timeline_columns(rows).items():
        dtype = {"step": np.int32, "run": object, "node": object, "label": object, "color": object}.get(key, np.float64)
        out[key] = np.asarray(values, dtype=dtype) if values else np.zeros(0, dtype=dtype)
    return out


def samples_note(step: int, shown: int, total: int) -> str:
    """The line above the samples table: how many rows of the step it shows (``PICK_STEP_JS``
    says the same in the browser)."""
    if not shown:
        return f"step {step}: no experience Parquet"
    if total > shown:
        return f"step {step}: the first {shown} of {total} samples (flowrl dashboard --max-samples N shows more)"
    return f"step {step}: {shown} samples"


def gantt(tl_shown: Any) -> tuple[Any, Any]:
    """The step's Gantt of graph nodes (rows of ``tl_shown``) and the note shown while there is no timeline."""
    from bokeh.models import Div, FactorRange, HoverTool, LabelSet
    from bokeh.plotting import figure

    fig = figure(title="node timeline", y_range=FactorRange(factors=["(none)"]), height=300,
                 sizing_mode="stretch_width", tools="xpan,xwheel_zoom,reset,save", toolbar_location="above",
                 name="timeline", x_axis_label="seconds since the step was submitted")
    # the colour is a column (stable_color), so nodes that first appear after the page was
    # built get theirs too
    bars = fig.hbar(y="node", left="start", right="end", height=0.6, source=tl_shown,
                    fill_color="color", fill_alpha="alpha", line_color=None, name="timeline_bars")
    fig.add_layout(LabelSet(x="end", y="node", text="label", source=tl_shown, x_offset=4, y_offset=-6,
                            text_font_size="8pt"))
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("node", "@node"), ("start", "@start{0.000}s"),
                                                        ("end", "@end{0.000}s"), ("took", "@duration{0.000}s")]))
    # no x_range.start = 0: with trainer.staleness a step's generation ran before the step was
    # submitted (negative start), and the next step's ran during this step's update
    return fig, Div(text=f"<i>{NO_TIMELINE}</i>", name="timeline_note", visible=False)


def samples_table(smp_shown: Any) -> Any:
    """The chosen step's sampled prompts, responses and rewards (rows of ``smp_shown``)."""
    from bokeh.models import DataTable, HTMLTemplateFormatter, NumberFormatter, TableColumn

    widths = {"step": 40, "uid": 60, "group": 45, "data_source": 110, "prompt": 260, "response": 360,
              "ground_truth": 90, "score": 55, "response_length": 60, "advantage": 70, "num_turns": 45,
              "tool_calls": 45}
    titles = {"num_turns": "turns", "tool_calls": "tool calls", "response_length": "length"}
    fmt = {"score": NumberFormatter(format="0.000"), "advantage": NumberFormatter(format="0.000")}
    columns = [TableColumn(field=k, title=titles.get(k, k.replace("_", " ")), width=widths[k],
                           **({"formatter": fmt[k]} if k in fmt else {}))
               for k in SAMPLE_COLUMNS]
    # a vision-language prompt's pictures (run_reader's "images": <img> thumbnails), row-high, beside the prompt
    thumbs = HTMLTemplateFormatter(template="""<%= value ? value.replace(/ width="\\d+" height="\\d+"/g, ' height="22"') : "" %>""")
    columns.insert(SAMPLE_COLUMNS.index("prompt") + 1, TableColumn(field="images", title="image", width=60,
                                                                   formatter=thumbs))
    return DataTable(source=smp_shown, columns=columns, height=320, sizing_mode="stretch_width",
                     index_position=None, name="samples", selectable=True)


def header_html(readers: list[RunReader], labels: list[str], *, live: bool) -> str:
    """The page's header: the run's line (live: with the Dask dashboard's link while it answers),
    or a line per run in its colour."""
    updated = time.strftime("%H:%M:%S") if live else "static export " + time.strftime("%Y-%m-%d %H:%M")
    if len(readers) == 1:
        return ("<h1 style='margin:4px 0'>flowrl run</h1>" + run_line(readers[0], dask=live)
                + f"<div>updated {updated}</div>")
    lines = "".join(f"<li><span style='color:{run_color(i)};font-weight:bold'>&#9632; {html.escape(label)}</span> "
                    f"{run_line(r, dask=False)}</li>" for i, (label, r) in enumerate(zip(labels, readers)))
    return (f"<h1 style='margin:4px 0'>flowrl: {len(readers)} runs</h1>"
            f"<ul style='margin:2px 0'>{lines}</ul><div>updated {updated}</div>")


def run_line(r: RunReader, *, dask: bool) -> str:
    """A run's header line: directory, model, algorithm, training steps logged (not a row of
    validation alone: ``val_before_train``), last score; with ``dask``, the Dask dashboard's
    link while it answers (``RunReader.check_dask_dashboard``; an export links nothing: the
    run's cluster is gone by the time it is read)."""
    cfg = r.config
    model = (cfg.get("model") or {}).get("path", "?")
    algo = (cfg.get("algorithm") or {}).get("adv_estimator", "?")
    total = (cfg.get("trainer") or {}).get("total_training_steps", "?")
    steps = r.training_steps
    score = r.metrics[steps[-1]].get(names.SCORE_MEAN) if steps else None
    text = (f"<div><code>{html.escape(str(r.run_dir))}</code></div>"
            f"<div>model <code>{html.escape(str(model))}</code> &middot; {html.escape(str(algo))} &middot; "
            f"<b>{len(steps)}</b> / {html.escape(str(total))} steps logged"
            + (f" &middot; last {names.SCORE_MEAN} <b>{score:.4f}</b>" if isinstance(score, (int, float)) and math.isfinite(score) else ""))
    link = r.dask_dashboard
    if dask and link and r.dask_answers:
        text += f" &middot; <a href='{html.escape(link)}' target='_blank' id='dask-dashboard'>Dask dashboard</a>"
    elif dask and link:
        text += " &middot; Dask dashboard: not answering (the run's cluster has stopped)"
    note = f" &middot; {html.escape(r.tokenizer_note)}" if r.tokenizer_note else ""
    return text + note + "</div>"

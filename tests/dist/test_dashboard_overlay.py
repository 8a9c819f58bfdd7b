"""Issue 20's dashboard items in headless Chromium, on synthetic run directories (no training):
several runs overlaid with a legend, the EMA smoothing slider, a figure's log-scale toggle, the
metric filter with several runs, the conversation view of a multi-turn sample, and the node
timeline of a ``trainer.staleness=1`` run (gen(k+1) during update(k)).

One page for all of them: ``flowrl dashboard RUNS/ --export`` of a directory holding two runs,
opened once. Each check reads what the browser computed and drew (the glyph views' plotted y
values, tick labels from the page's formatter, text of the shadow DOM) and saves a screenshot of
the part it checks under ``test-artifacts/``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from chromium_cdp import RENDERED_MS_JS, Chromium, chromium_binary  # tests/dist/chromium_cdp.py
from flowrl_testing.synthetic_run import write_synthetic_run

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(chromium_binary() is None, reason="no chromium (apt-get install -y chromium; .ci/run does)"),
]

ARTIFACTS = Path(os.environ.get("FLOWRL_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
DOC = "Bokeh.documents[0]"
KEY = "critic/score/mean"
STEPS = 40
SHORTER = 30
#: A dozen of a default run's keys (each figure costs render time; the render benchmark uses all).
KEYS = ("critic/score/mean", "critic/score/max", "critic/score/min", "actor/grad_norm", "actor/entropy", "actor/lr",
        "actor/pg_loss", "timing_s/gen", "timing_s/step", "response_length/mean", "perf/throughput")


def model(name: str) -> str:
    return f"{DOC}.get_model_by_name({json.dumps(name)})"


def plotted_y(browser: Chromium, fig: str, index: int) -> list[float]:
    """The y values the ``index``-th renderer of figure ``fig`` plots (after its transforms)."""
    ys = browser.evaluate(f"(() => {{ const v = Bokeh.index.find_one({model(fig)}.renderers[{index}]);"
                          " return v ? Array.from(v.glyph.y, (y) => Number.isFinite(y) ? y : null) : null; })()")
    return [math.nan if y is None else y for y in ys]


def shot(browser: Chromium, name: str, path: str) -> Path:
    """A screenshot of one model's view (its bounding box on the page)."""
    rect = browser.evaluate(f"(() => {{ const v = Bokeh.index.find_one({model(name)}); v.el.scrollIntoView();"
                            " const r = v.el.getBoundingClientRect();"
                            " return {x: r.x + window.scrollX, y: r.y + window.scrollY, width: r.width, height: r.height}; })()")
    clip = {**rect, "scale": 1}
    import base64

    data = browser.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip})["data"]
    out = ARTIFACTS / path
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(base64.b64decode(data))
    print(f"screenshot: {out}")
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    # runs of different lengths: the first one shorter (the step section must not open on a step it lacks)
    a = write_synthetic_run(root / "a_async", SHORTER, seed=0, staleness=1, agent=True, keys=KEYS)
    write_synthetic_run(root / "b_sync", STEPS, seed=1, lift=0.25, tokenizer_dir=a / "tokenizer", keys=KEYS)
    return root


@pytest.fixture(scope="module")
def page(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("page") / "overlay.html"
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", "dashboard", str(runs), "--export", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(2 runs)" in proc.stdout
    # generous timeouts: on a loaded CI machine a page's layout can keep the browser busy for a minute
    with Chromium(width=1400, height=2000, timeout_s=180) as browser:
        browser.open(out.as_uri())
        browser.wait_for(RENDERED_MS_JS, timeout_s=300)
        yield browser


def test_several_runs_overlay_with_a_legend_and_the_filter(page, runs):
    assert page.evaluate(f"{model('run_select')}.options") == ["a_async", "b_sync"]
    # the legend below the plot, not over the curves (issue 35)
    legend = page.evaluate(f"{model('metric:' + KEY)}.below.find((m) => m.items !== undefined).items.map((i) => i.label.value)")
    assert legend == ["a_async", "b_sync"]
    assert page.evaluate(f"{model('metric:' + KEY)}.center.every((m) => m.items === undefined)")
    # each run's line plots its own values: the two runs' score series differ
    rows = {name: [json.loads(line)[KEY] for line in (runs / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("a_async", "b_sync")}
    page.wait_for(f"Bokeh.index.find_one({model('metric:' + KEY)}.renderers[3]) !== null", timeout_s=60)
    assert np.allclose(plotted_y(page, "metric:" + KEY, 1), rows["a_async"])  # renderers: raw a, smooth a, raw b, smooth b
    assert np.allclose(plotted_y(page, "metric:" + KEY, 3), rows["b_sync"])
    header = page.evaluate(f"{model('header')}.text")
    assert "flowrl: 2 runs" in header and "a_async" in header and "b_sync" in header
    # the filter, with several runs: only score figures stay, each still with both runs' lines
    page.evaluate(f"{model('metric_filter')}.value_input = 'score'")
    visible = page.wait_for(
        f"(() => {{ const m = [...{DOC}.all_models].filter((m) => m.name && m.name.startsWith('metric:'));"
        " const v = m.filter((f) => f.visible).map((f) => f.name); return v.length < m.length ? v : null; })()",
        timeout_s=30)
    assert sorted(visible) == ["metric:critic/score/max", "metric:critic/score/mean", "metric:critic/score/min"]
    shot(page, "all_metrics", "dashboard_overlay_filtered.png")
    page.evaluate(f"{model('metric_filter')}.value_input = ''")


def test_runs_of_different_lengths_open_on_a_step_with_rows(page):
    """Issue 35: the page opens on the chosen run's last step (its Gantt and samples drawn), and
    the step selector offers the chosen run's steps: switching to a shorter run that lacks the
    step shown moves to its last step."""
    assert page.evaluate(f"{model('run_select')}.value") == "a_async"
    assert page.evaluate(f"{model('step_select')}.options") == [str(s) for s in range(SHORTER)]
    assert page.evaluate(f"{model('step_select')}.value") == str(SHORTER - 1)
    assert page.evaluate(f"{model('samples_shown')}.data.step.length") > 0
    assert set(page.evaluate(f"{model('timeline_shown')}.data.step")) >= {SHORTER - 1}
    page.evaluate(f"{model('run_select')}.value = 'b_sync'")
    page.wait_for(f"{model('step_select')}.options.length === {STEPS}", timeout_s=30)
    page.evaluate(f"{model('step_select')}.value = '{STEPS - 1}'")
    page.wait_for(f"{model('samples_note')}.text.startsWith('step {STEPS - 1}: 16 samples')", timeout_s=30)
    page.evaluate(f"{model('run_select')}.value = 'a_async'")
    page.wait_for(f"{model('step_select')}.value === '{SHORTER - 1}'", timeout_s=30)
    page.wait_for(f"{model('samples_note')}.text.startsWith('step {SHORTER - 1}: 16 samples')", timeout_s=30)
    assert set(page.evaluate(f"{model('samples_shown')}.data.run")) == {"a_async"}


def test_smoothing_slider_smooths_every_run_as_tensorboard_does(page, runs):
    from flowrl.metrics.dashboard_figures import ema

    raw = [json.loads(line)[KEY] for line in (runs / "a_async" / "metrics.jsonl").read_text().splitlines()]
    fig = "overview:" + KEY
    page.wait_for(f"Bokeh.index.find_one({model(fig)}.renderers[1]) !== null", timeout_s=60)
    assert np.allclose(plotted_y(page, fig, 1), raw)  # smoothing 0: the values
    page.evaluate(f"{model('smoothing')}.value = 0.9")
    page.wait_for(f"(() => {{ const v = Bokeh.index.find_one({model(fig)}.renderers[1]);"
                  f" return Math.abs(v.glyph.y[5] - {raw[5]}) > 1e-9; }})()", timeout_s=30)
    smoothed = plotted_y(page, fig, 1)
    assert np.allclose(smoothed, ema(raw, 0.9), atol=1e-9)
    assert np.allclose(plotted_y(page, fig, 0), raw)  # the faint raw line stays
    # smoother: the step-to-step wiggle shrinks (a 0.9 EMA of noise 0.05 around a curve)
    assert np.abs(np.diff(smoothed)).mean() < 0.5 * np.abs(np.diff(raw)).mean()
    assert np.allclose(plotted_y(page, fig, 3), ema([json.loads(line)[KEY] for line in
                                                     (runs / "b_sync" / "metrics.jsonl").read_text().splitlines()], 0.9))
    shot(page, "overview", "dashboard_smoothing_0.9.png")
    page.evaluate(f"{model('smoothing')}.value = 0")


def test_log_scale_toggle_per_figure(page, runs):
    key = "actor/grad_norm"  # lognormal values around 1.6
    fig = "metric:" + key
    raw = [json.loads(line)[key] for line in (runs / "a_async" / "metrics.jsonl").read_text().splitlines()]
    page.wait_for(f"Bokeh.index.find_one({model(fig)}.renderers[1]) !== null", timeout_s=60)
    page.evaluate(f"{model('log:' + fig)}.callback.execute({model('log:' + fig)})")  # the toolbar button's action
    page.wait_for(f"{model(fig)}.title.text === '{key} (log)'", timeout_s=30)
    page.wait_for(f"(() => {{ const v = Bokeh.index.find_one({model(fig)}.renderers[1]);"
                  f" return Math.abs(v.glyph.y[0] - {math.log10(raw[0])}) < 1e-9; }})()", timeout_s=30)
    assert np.allclose(plotted_y(page, fig, 1), np.log10(raw))
    # only that figure: its neighbour stays linear
    assert not page.evaluate(f"{model('metric:actor/entropy')}.tags.includes('log')")
    # its tick labels read the values, not their logarithms
    code = f"{model(fig)}.left[0].formatter"
    labels = page.evaluate(f"(() => {{ const f = {code}; const fig = {model(fig)}; const g = new Function('fig', 'tick', 'index',"
                           f" 'ticks', f.code); const t = [-1, 0, 0.5, 1]; return t.map((v, i) => g(fig, v, i, t)); }})()")
    assert labels == ["1e-1", "1", "3.2", "1e1"], labels
    shot(page, fig, "dashboard_log_grad_norm.png")
    page.evaluate(f"{model('log:' + fig)}.callback.execute({model('log:' + fig)})")
    page.wait_for(f"{model(fig)}.title.text === '{key}'", timeout_s=30)


def test_conversation_view_marks_tool_turns(page):
    page.evaluate(f"{model('run_select')}.value = 'a_async'")
    page.wait_for(f"{model('samples_shown')}.data.num_turns.length > 0", timeout_s=30)
    data = page.evaluate(f"{model('samples_shown')}.data")
    assert set(data["run"]) == {"a_async"} and data["num_turns"][0] == 2 and data["tool_calls"][0] == 1
    page.evaluate(f"{model('samples_shown')}.selected.indices = [0]")
    text = page.wait_for(f"(() => {{ const t = {model('sample_detail')}.text; return t.includes('tool-turn') ? t : null; }})()",
                         timeout_s=30)
    turns = json.loads(data["turns"][0])
    assert [k for k, _ in turns] == [1, 0, 1]
    # prompt, model turn 1 (the call), the tool's answer, model turn 2, in that order
    order = [text.index(s) for s in ("prompt", "model, turn 1", "tool answer 1", "model, turn 2")]
    assert order == sorted(order), text
    assert "&lt;tool_call&gt;" in text and f"={turns[1][1].strip()[1:]}" in text
    assert "2 model turn(s), 1 tool call(s)" in text
    shot(page, "sample_detail", "dashboard_conversation.png")


def test_staleness_timeline_shows_the_next_generation_during_the_update(page, runs):
    page.evaluate(f"{model('run_select')}.value = 'a_async'")
    page.evaluate(f"{model('step_select')}.value = '5'")
    shown = page.wait_for(f"(() => {{ const d = {model('timeline_shown')}.data;"
                          " return d.node.includes('gen (step 6)') ? d : null; })()", timeout_s=30)
    span = {n: (s, e) for n, s, e in zip(shown["node"], shown["start"], shown["end"])}
    gen_next, update = span["gen (step 6)"], span["update_actor"]
    assert gen_next[0] < update[1] and gen_next[1] > update[0], span  # they overlap
    assert span["gen"][0] < 0  # this step's own generation ran before the step was submitted
    assert set(shown["step"]) == {5, 6} and set(shown["run"]) == {"a_async"}
    # the overlap is drawn: the Gantt's x range reaches the negative start, the row exists
    factors = page.evaluate(f"{model('timeline')}.y_range.factors")
    assert "gen (step 6)" in factors and factors[-1] == "gen"
    page.wait_for(f"Bokeh.index.find_one({model('timeline')}).frame.x_range.start < 0", timeout_s=30)
    shot(page, "timeline", "dashboard_staleness_timeline.png")
    # the synchronous run has no generation ahead
    page.evaluate(f"{model('run_select')}.value = 'b_sync'")
    shown = page.wait_for(f"(() => {{ const d = {model('timeline_shown')}.data;"
                          " return d.run.length && d.run[0] === 'b_sync' ? d : null; })()", timeout_s=30)
    assert set(shown["step"]) == {5} and all(s >= 0 for s in shown["start"])

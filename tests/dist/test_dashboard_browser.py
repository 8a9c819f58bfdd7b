"""The dashboard in a real browser (headless Chromium over CDP), for a real 3-step run directory.

Checks what rendered, not only that the server answered: metric curves (canvases of the
``metric:<key>`` figures, one per metrics.jsonl key), the node timeline (the Gantt's rows for the
chosen step), the samples table (decoded prompts in the DataTable's cells), the reshard and
throughput panels, no dead link to the finished run's Dask dashboard; then a full-page screenshot
that must not be blank, saved under ``test-artifacts/``. The same checks run on the ``--export``
HTML opened from ``file://``, and a live server opened before the first step shows every
section's figures as the steps are written. Step numbers are read from the run's files (a run
counts from 0 or from 1).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from chromium_cdp import DOM_PROBE_JS, Chromium, chromium_binary, stop_process  # tests/dist/chromium_cdp.py
from flowrl.data import experience as ex

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),  # a 3-step run, a Bokeh server and Chromium: a minute or two on a quiet machine
    pytest.mark.skipif(chromium_binary() is None, reason="no chromium (apt-get install -y chromium; .ci/run does)"),
]

ARTIFACTS = Path(os.environ.get("FLOWRL_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
DOC = "Bokeh.documents[0]"
# ... and every figure in the page: the live server builds the lower panels' figures after the
# first paint, the export attaches them then (both set this mark once they are all in)
READY_JS = (f"window.Bokeh && Bokeh.documents.length > 0 && {DOC}.get_model_by_name('samples_shown') !== null"
            f" && {DOC}.get_model_by_name('samples_shown').data.step.length > 0"
            " && performance.getEntriesByName('flowrl:all-metrics').length > 0")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir, addition_data):
    """A real run: 3 GRPO steps through the CLI, with the Dask dashboard on (its link recorded)
    and the console and TensorBoard loggers."""
    out = tmp_path_factory.mktemp("dash") / "run"
    cmd = [
        sys.executable, "-m", "flowrl.cli", "train",
        f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}",
        "trainer.total_training_steps=3", f"trainer.run_dir={out}", "trainer.progress=false",
        "data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=8", "cluster.dashboard=true",
        "trainer.logger=[console,tensorboard]",
    ]
    # TensorBoard's files where verl's go: $TENSORBOARD_DIR (else tensorboard_log/ in the working directory)
    tensorboard = out.parent / "tensorboard"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "TENSORBOARD_DIR": str(tensorboard)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a run that succeeded ends quietly (issue 20): no worker heartbeat racing the cluster's close
    # (a CommClosedError traceback), no worker restarted by its nanny during the teardown
    for noise in ("Traceback", "CommClosedError", "Failed to communicate with scheduler", "Restarting worker"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
    assert (out / "timeline.jsonl").is_file() and json.loads((out / "run_info.json").read_text())["dask_dashboard"]
    assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("step ")] == ["1/3", "2/3", "3/3"]
    assert list(tensorboard.glob("events.out.tfevents.*")) or list((out / "tensorboard").glob("events.out.tfevents.*"))
    return out


class DashboardServer:
    """``flowrl dashboard RUN_DIR --port 0`` in a subprocess; ``url`` from its first line."""

    def __init__(self, run_dir: Path, *, interval_s: float = 0.5, timeout_s: float = 90) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flowrl.cli", "dashboard", str(run_dir), "--port", "0", "--interval", str(interval_s)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stdout], daemon=True).start()
        self.output: list[str] = []
        try:
            while True:
                line = lines.get(timeout=timeout_s)
                self.output.append(line)
                match = re.search(r"http://127\.0\.0\.1:\d+/", line)
                if match:
                    self.url = match.group(0)
                    break
            # issue 35: not seconds of silence before the URL: a line at once, one while the page builds
            assert self.output[0].startswith("flowrl dashboard: starting the server for"), self.output
            assert self.output[1].startswith("flowrl dashboard: reading the run"), self.output
        except queue.Empty:
            self.close()
            raise TimeoutError(f"no dashboard URL within {timeout_s}s: {''.join(self.output)}") from None

    def close(self) -> None:
        stop_process(self.proc)


def metric_keys(run_dir: Path) -> set[str]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {k for row in rows for k in row if k != "step"}


def sample_steps(run_dir: Path) -> list[int]:
    """The steps with experience Parquet (a run counts from 0 or from 1: read, not assumed)."""
    return sorted(int(p.stem.split("_")[1]) for p in (run_dir / "experience").glob("step_*.parquet"))


SHOWN_FIGURES_JS = (f"[...{DOC}.all_models].filter(m => m.name && /^(overview|throughput|reshard|metric):/.test(m.name))"
                    ".filter(m => { const v = Bokeh.index.find_one(m); return v != null && v.el.checkVisibility(); })"
                    ".map(m => m.name)")


def check_panels(browser: Chromium, run_dir: Path, shot: str, *, live: bool) -> dict:
    """The assertions both the live page and the exported file must pass."""
    first, *_, last = sample_steps(run_dir)
    browser.wait_for(READY_JS, timeout_s=90)
    # every metric key has its figure, and every figure drew (a canvas with a size)
    names = browser.evaluate(f"{DOC}.all_models ? [...{DOC}.all_models].map(m => m.name).filter(n => n) : []")
    keys = metric_keys(run_dir)

    def panel(name: str) -> set[str]:
        return {n.split(":", 1)[1] for n in names if n.startswith(name + ":")}

    assert panel("metric") == keys, keys ^ panel("metric")
    assert panel("throughput") == {k for k in keys if k.startswith("perf/")} != set()
    assert "critic/score/mean" in panel("overview")
    reshard = {k for k in keys if k.startswith("reshard/")}
    assert panel("reshard") == reshard
    probe = browser.wait_for(f"(() => {{ const p = {DOM_PROBE_JS.strip()}; return p.canvases >= {len(keys)} ? p : null; }})()",
                             timeout_s=60)
    for text in ("Overview", "Step", "Throughput", "Reshard", "All metrics",
                 "critic/", "actor/", "timing_s/", "perf/", "response_length/", f"step {last}: 32 samples"):
        assert text in probe["text"], text
    assert ("no reshard metrics yet" in probe["text"]) == (not reshard)
    # the samples table: decoded prompts ("12+34=") and their ground truths, in the grid's cells
    prompts = [c for c in probe["cells"] if re.fullmatch(r"\d+\+\d+=", c)]
    assert len(prompts) >= 8, probe["cells"][:40]
    first_uid = {step: pq.read_table(ex.step_path(run_dir, step)).column("uid")[0].as_py() for step in (first, last)}
    assert first_uid[last] in probe["cells"] and first_uid[first] not in probe["cells"]
    # the timeline of the chosen step: one bar per graph node, in order of start
    shown = browser.evaluate(f"{DOC}.get_model_by_name('timeline_shown').data")
    assert set(shown["step"]) == {last}
    recorded = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]
    assert set(shown["node"]) == {r["node"] for r in recorded if r["step"] == last}
    # every node of the graph, the weight sync (collected after the step's result) included
    assert {"gen", "reward", "ref", "adv", "update_actor", "collect"} < set(shown["node"])
    assert shown["node"][0] == "gen" and all(e >= s >= 0 for s, e in zip(shown["start"], shown["end"]))
    factors = browser.evaluate(f"{DOC}.get_model_by_name('timeline').y_range.factors")
    assert factors[-1] == "gen"  # the first node on top
    # the Dask dashboard the run recorded: its cluster is gone (the run ended), so no link to it:
    # a live page says it does not answer, an export (read later, anywhere) says nothing of it
    link = json.loads((run_dir / "run_info.json").read_text())["dask_dashboard"]
    assert link not in probe["links"]
    assert ("Dask dashboard: not answering" in probe["text"]) == live and (live or "Dask" not in probe["text"])
    # choosing another step swaps the timeline and the table, in the browser
    browser.evaluate(f"{DOC}.get_model_by_name('step_select').value = '{first}'")
    browser.wait_for(f"{DOC}.get_model_by_name('samples_note').text === 'step {first}: 32 samples'", timeout_s=60)
    shown0 = browser.evaluate(f"{DOC}.get_model_by_name('timeline_shown').data")
    # the first step's own rows, plus rows of later steps that ran meanwhile (its weight sync
    # overlaps the next step's submission), named by their step
    assert first in set(shown0["step"]) and {n for n, s in zip(shown0["node"], shown0["step"]) if s == first} == \
        {r["node"] for r in recorded if r["step"] == first}
    assert all(n.endswith(f"(step {s})") for n, s in zip(shown0["node"], shown0["step"]) if s != first)
    # ... and the grid's cells show the first step's rows (a DataTable can keep drawing stale rows)
    browser.wait_for(f"(() => {{ const p = {DOM_PROBE_JS.strip()}; return p.cells.includes({json.dumps(first_uid[first])})"
                     f" && !p.cells.includes({json.dumps(first_uid[last])}); }})()", timeout_s=30)
    path = browser.screenshot(ARTIFACTS / shot)
    assert_not_blank(path)
    print(f"screenshot: {path}")
    return probe


def assert_not_blank(path: Path) -> None:
    from PIL import Image

    image = Image.open(path).convert("RGB")
    assert image.width >= 1000 and image.height >= 1500, image.size
    small = image.resize((image.width // 4, image.height // 4))
    pixels = list(small.get_flattened_data() if hasattr(small, "get_flattened_data") else small.getdata())
    non_white = sum(1 for p in pixels if sum(p) < 720) / len(pixels)
    colours = len(set(pixels))
    assert non_white > 0.02 and colours > 50, (non_white, colours)


def test_live_dashboard_renders_curves_timeline_and_samples(run_dir):
    server = DashboardServer(run_dir)
    try:
        with Chromium() as browser:
            browser.open(server.url)
            check_panels(browser, run_dir, "dashboard_live.png", live=True)
    finally:
        server.close()


def test_exported_html_opens_without_a_server(run_dir, tmp_path):
    """The export opens from file:// and passes the live page's checks; then, in a narrower
    window, the formatting, filter, colour and width checks."""
    out = tmp_path / "dashboard.html"
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", "dashboard", str(run_dir), "--export", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = out.read_text()
    assert "cdn.bokeh.org" not in html and "<script" in html  # BokehJS inlined: opens offline
    with Chromium() as browser:
        browser.open(out.as_uri())
        check_panels(browser, run_dir, "dashboard_export.png", live=False)
        check_formats_filter_colours_and_width(browser)


def test_live_dashboard_opened_before_the_first_step_follows_the_run(run_dir, tmp_path):
    """Issue 35: a page opened before the run's first step (what people do) shows every
    section's figures by the end of the run, without a reload, and follows the latest step:
    start from a copy holding what a run writes before its first step, open the page, then
    write the run's steps into it one by one."""
    live = tmp_path / "live"
    (live / "experience").mkdir(parents=True)
    for name in ("config.yaml", "run_info.json"):
        shutil.copy(run_dir / name, live / name)
    metrics = {json.loads(line)["step"]: line for line in (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)}
    timeline = (run_dir / "timeline.jsonl").read_text().splitlines(keepends=True)
    steps = sorted(metrics)

    def write_step(step: int) -> None:
        with open(live / "metrics.jsonl", "a") as fh:
            fh.write(metrics[step])
        with open(live / "timeline.jsonl", "a") as fh:
            fh.writelines(line for line in timeline if json.loads(line)["step"] == step)
        path = ex.step_path(run_dir, step)
        if path.is_file():
            shutil.copy(path, ex.step_path(live, step))

    server = DashboardServer(live, interval_s=0.3)
    try:
        with Chromium() as browser:
            browser.open(server.url)
            browser.wait_for(f"window.Bokeh && Bokeh.documents.length > 0 && {DOC}.get_model_by_name('header') !== null"
                             " && performance.getEntriesByName('flowrl:first-paint').length"
                             " + performance.getEntriesByName('flowrl:all-metrics').length > 0", timeout_s=90)
            assert browser.evaluate(f"{DOC}.get_model_by_name('step_select').options") == []
            for step in steps:
                write_step(step)
                browser.wait_for(f"{DOC}.get_model_by_name('metrics').data.step.includes({step})", timeout_s=60)
            # every section's figures, drawn: one per key in All metrics, the perf/* and
            # reshard/* panels, the overview
            keys = metric_keys(run_dir)
            wanted = ({f"metric:{k}" for k in keys} | {f"throughput:{k}" for k in keys if k.startswith("perf/")}
                      | {f"reshard:{k}" for k in keys if k.startswith("reshard/")} | {"overview:critic/score/mean"})
            shown = browser.wait_for(f"(() => {{ const s = {SHOWN_FIGURES_JS}; return s.length >= {len(wanted)} ? s : null; }})()",
                                     timeout_s=120)
            assert wanted <= set(shown), wanted - set(shown)
            last = sample_steps(run_dir)[-1]
            browser.wait_for(f"{DOC}.get_model_by_name('step_select').value === '{last}'", timeout_s=60)
            browser.wait_for(f"{DOC}.get_model_by_name('samples_note').text === 'step {last}: 32 samples'", timeout_s=60)
            browser.wait_for(f"new Set({DOC}.get_model_by_name('timeline_shown').data.step).has({last})", timeout_s=60)
            assert browser.evaluate(f"Array.from({DOC}.get_model_by_name('metrics').data.step)") == steps
            probe = browser.evaluate(DOM_PROBE_JS)
            assert probe["canvases"] >= len(wanted), probe["canvases"]
            print(f"screenshot: {browser.screenshot(ARTIFACTS / 'dashboard_live_from_step_0.png')}")
    finally:
        server.close()


def check_formats_filter_colours_and_width(browser: Chromium) -> None:
    """Issue 20's dashboard items, as the browser shows them: tick labels and hover values with
    the digits that matter, the metric filter, a colour per node kept across steps, and figures
    that wrap in a 900 px window instead of being clipped."""
    browser.call("Emulation.setDeviceMetricsOverride", {"width": 900, "height": 2600, "deviceScaleFactor": 1, "mobile": False})
    fmt = f"{DOC}.get_model_by_name('metric:critic/score/mean').left[0].formatter.code"

    def ticks(values: list[float]) -> list[str]:
        return browser.evaluate(f"(() => {{ const f = new Function('tick', 'index', 'ticks', {fmt});"
                                f" const t = {json.dumps(values)}; return t.map((v, i) => f(v, i, t)); }})()")

    # reshard byte counts 50 apart: distinct labels with a suffix, not 1.0383370e+6
    assert ticks([1038300, 1038350, 1038400]) == ["1.03830M", "1.03835M", "1.03840M"]
    # a learning rate around 5e-4, and ordinary values
    assert ticks([4.8e-4, 5.0e-4, 5.2e-4]) == ["4.80e-4", "5.00e-4", "5.20e-4"]
    assert ticks([0, 0.5, 1.0]) == ["0", "0.5", "1.0"] and ticks([0, 20, 40]) == ["0", "20", "40"]
    # the metric filter hides the other figures and their section titles, in the browser: within
    # seconds (it took minutes when each hidden figure laid out the whole page again; a 1,000-step
    # page's filter is checked in test_dashboard_large.py)
    browser.evaluate(f"{DOC}.get_model_by_name('metric_filter').value_input = 'actor/'")
    visible = browser.wait_for(
        f"(() => {{ const m = [...{DOC}.all_models].filter(m => m.name && m.name.startsWith('metric:'));"
        " const v = m.filter(f => f.visible).map(f => f.name);"
        " return v.length && v.length < m.length ? v : null; })()", timeout_s=30)
    assert visible and all(name.startswith("metric:actor/") for name in visible), visible
    # ... and the browser shows those figures only: the others have no view or are not displayed
    displayed = browser.wait_for(
        f"(() => {{ const d = [...{DOC}.all_models].filter(m => m.name && m.name.startsWith('metric:')).filter(m => {{"
        " const v = Bokeh.index.find_one(m); return v != null && v.el.checkVisibility(); }).map(m => m.name);"
        f" return d.length === {len(visible)} ? d : null; }})()", timeout_s=30)
    assert sorted(displayed) == sorted(visible), (displayed, visible)
    # one colour per node, the same in every step
    data = browser.evaluate(f"{DOC}.get_model_by_name('timeline_all').data")
    by_node: dict[str, set[str]] = {}
    for node, colour in zip(data["node"], data["color"]):
        by_node.setdefault(node, set()).add(colour)
    assert all(len(c) == 1 for c in by_node.values()), by_node
    assert len({next(iter(c)) for c in by_node.values()}) == len(by_node)
    # nothing wider than the window: the figures wrapped
    width = browser.wait_for("(() => { const w = [document.documentElement.scrollWidth, window.innerWidth];"
                             " return w[1] <= 900 && w[0] <= w[1] + 2 ? w : null; })()", timeout_s=30)
    assert width, width
    path = browser.screenshot(ARTIFACTS / "dashboard_narrow_filtered.png")
    print(f"screenshot: {path}")

"""The dashboard's data side without a browser: incremental reading of a run directory, the
samples table, and the Bokeh models (panels, step selector, live update, static export).
The browser checks are in tests/dist/test_dashboard_browser.py."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from flowrl.data import experience as ex
from flowrl.metrics.run_reader import RunReader, sample_columns


def write_step(run_dir, step, *, extra=None):
    row = {"step": step, "critic/score/mean": 0.1 * step, "actor/pg_loss": -0.5, "perf/throughput": 100.0 + step,
           "timing_s/gen": 0.25, **(extra or {})}
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
    with open(run_dir / "timeline.jsonl", "a") as fh:
        for node, start, end in (("gen", 0.0, 0.25), ("reward", 0.25, 0.5), ("update_actor", 0.5, 1.0)):
            fh.write(json.dumps({"step": step, "node": node, "start": start, "end": end}) + "\n")
    table = pa.table({
        "uid": [f"{step}-0", f"{step}-1", f"{step}-2"], "group": pa.array([0, 0, 1], pa.int64()),
        "data_source": ["a", "a", "b"], "ground_truth": ["3", "3", "5"],
        "prompt_ids": pa.array([[1, 2], [1, 2], [3]], ex.TOKEN_IDS),
        "response_ids": pa.array([[4, 5, 6], [7], []], ex.TOKEN_IDS),
        "score": pa.array([1.0, 0.0, 0.5], pa.float32()),
        "advantages": pa.array([[0.5, 0.5, 0.5], [-0.5], []], ex.TOKEN_FLOATS),
    })
    (run_dir / "experience").mkdir(exist_ok=True)
    pq.write_table(table, ex.step_path(run_dir, step))


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump({"model": {"path": str(tmp_path / "no-model")},
                                                  "trainer": {"total_training_steps": 5}}))
    for step in range(2):
        write_step(d, step)
    return d


def test_reader_reads_metrics_incrementally_and_waits_for_a_cut_line(run_dir):
    reader = RunReader(run_dir)
    changes = reader.refresh()
    assert [r["step"] for r in changes.new_metric_rows] == [0, 1] and changes.new_sample_steps == [0, 1]
    assert not reader.refresh().any  # nothing new
    text = json.dumps({"step": 2, "critic/score/mean": 0.5})
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(text[:10])  # the trainer is mid-write
    assert reader.refresh().new_metric_rows == []
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(text[10:] + "\n")
    assert [r["step"] for r in reader.refresh().new_metric_rows] == [2]
    cols = reader.metric_columns()
    assert cols["step"] == [0, 1, 2] and math.isnan(cols["actor/pg_loss"][2])  # key missing in step 2
    # a resumed run rewrites the file shorter: read again from the start
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "critic/score/mean": 0.0}) + "\n")
    changes = reader.refresh()
    assert changes.metrics_reset and sorted(reader.metrics) == [0]


def test_readers_share_what_they_parsed(run_dir, monkeypatch):
    """A server's sessions each have readers; a new one takes the rows and samples another
    parsed (issue 39), reads only lines written since, and not rows of a rewritten file."""
    from flowrl.metrics import run_reader

    first = RunReader(run_dir)
    first.refresh()

    def no_parse(*args):
        raise AssertionError("parsed again")

    with monkeypatch.context() as patch:
        patch.setattr(run_reader, "_parse_metric_row", no_parse)
        patch.setattr(RunReader, "_parse_samples", no_parse)
        second = RunReader(run_dir)
        changes = second.refresh()
    assert [r["step"] for r in changes.new_metric_rows] == [0, 1] and changes.new_sample_steps == [0, 1]
    assert second.metrics == first.metrics and second.samples[1] is first.samples[1]
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 2, "critic/score/mean": 0.5}) + "\n")
    assert [r["step"] for r in second.refresh().new_metric_rows] == [2]
    # rewritten (a resume) to as many bytes, other rows: a new reader parses it
    text = (run_dir / "metrics.jsonl").read_text()
    (run_dir / "metrics.jsonl").write_text(text.replace('"step": 1,', '"step": 7,'))
    third = RunReader(run_dir)
    third.refresh()
    assert sorted(third.metrics) == [0, 2, 7]


def test_samples_decode_with_a_tokenizer_or_show_ids(run_dir):
    table = pq.read_table(ex.step_path(run_dir, 0))

    class Tok:
        def batch_decode(self, ids, skip_special_tokens):
            return ["".join(chr(ord("a") + i) for i in seq) for seq in ids]

    cols = sample_columns(table, 0, Tok())
    assert cols["prompt"] == ["bc", "bc", "d"] and cols["response"] == ["efg", "h", ""]
    assert cols["response_length"] == [3, 1, 0] and cols["advantage"][:2] == [0.5, -0.5] and math.isnan(cols["advantage"][2])
    assert sample_columns(table, 0)["response"] == ["4 5 6", "7", ""]
    reader = RunReader(run_dir, max_samples=2)
    reader.refresh()
    assert reader.samples[1]["uid"] == ["1-0", "1-1"]  # the first max_samples rows
    assert "cannot load the tokenizer" in reader.tokenizer_note  # config's model.path does not exist


def test_bad_run_dir_and_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        RunReader(tmp_path / "nope")
    with pytest.raises(ValueError, match="max_samples"):
        RunReader(tmp_path, max_samples=0)


def test_dashboard_panels_step_selector_and_live_update(run_dir):
    pytest.importorskip("bokeh")
    from flowrl.metrics.dashboard import NO_RESHARD, Dashboard

    dash = Dashboard(run_dir, live=True)
    doc_models = list(dash.layout.references())
    names = {m.name for m in doc_models if getattr(m, "name", None)}
    for key in ("critic/score/mean", "actor/pg_loss", "perf/throughput", "timing_s/gen"):
        assert f"metric:{key}" in names
    assert "throughput:perf/throughput" in names and "overview:critic/score/mean" in names
    assert any(NO_RESHARD in getattr(m, "text", "") for m in dash.reshard.children)
    assert dash.step_select.options == ["0", "1"] and dash.step_select.value == "1"
    assert set(dash.tl_shown.data["step"]) == {1} and dash.tl_shown.data["node"][0] == "gen"
    assert dash.gantt.y_range.factors == ["update_actor", "reward", "gen"]  # first node on top
    assert dash.smp_shown.data["uid"] == ["1-0", "1-1", "1-2"]

    write_step(run_dir, 2, extra={"reshard/bytes": 1024.0})  # a new step, with a new key
    changes = dash.update()
    assert changes.new_sample_steps == [2]
    assert list(dash.metrics_src.data["step"]) == [0, 1, 2]
    assert dash.step_select.value == "2"  # following the latest step
    names = {m.name for m in dash.layout.references() if getattr(m, "name", None)}
    assert {"reshard:reshard/bytes", "metric:reshard/bytes"} <= names
    assert not any(NO_RESHARD in getattr(m, "text", "") for m in dash.reshard.children)


def test_deferred_page_builds_the_lower_panels_after_the_first_page(run_dir):
    """A live server's session (``defer=True``): the first page holds the overview's figures
    only; ``build_deferred`` builds the others into their panes' tags (the browser attaches
    them), and a key that appears meanwhile gets its figure at once."""
    pytest.importorskip("bokeh")
    from flowrl.metrics.dashboard import Dashboard

    def figure_names(dash):
        return {m.name for m in dash.layout.references() if type(m).__name__ == "figure"}

    dash = Dashboard(run_dir, live=True, defer=True)
    first = figure_names(dash)
    assert "overview:critic/score/mean" in first and not [n for n in first if n.split(":")[0] in ("metric", "throughput")]
    grids = [m for m in dash.layout.references() if getattr(m, "name", "") == "grid:metric"]
    assert grids and all(g.tags == [] and g.elements == [] for g in grids)
    write_step(run_dir, 2, extra={"reshard/bytes": 1024.0})  # a new key before the deferred build
    dash.update()
    assert "metric:reshard/bytes" in figure_names(dash)  # built at once, not deferred
    calls = 1
    while dash.build_deferred(budget_s=0.0):  # one pane per call
        calls += 1
    assert calls > 2 and not dash.build_deferred()
    names = figure_names(dash)
    for key in ("critic/score/mean", "actor/pg_loss", "timing_s/gen", "reshard/bytes"):
        assert f"metric:{key}" in names
    assert "throughput:perf/throughput" in names
    # each grid's figures wait in its tags for the browser (LIVE_ATTACH_JS), which the filter reads
    sections = dash.filter_callback.args["sections"]
    assert all(grid.tags for _, _, grid in sections)
    assert all(p.tags for p in dash.live_attach_callback.args["panes"])


def test_export_is_one_self_contained_file(run_dir, tmp_path):
    pytest.importorskip("bokeh")
    from flowrl.metrics.dashboard_server import export_html

    out = export_html(run_dir, tmp_path / "d.html")
    html = out.read_text()
    assert "cdn.bokeh.org" not in html and "flowrl_dashboard" in html and "samples_shown" in html
    assert len(html) > 500_000  # BokehJS inlined


def test_colours_are_stable_and_flat_series_get_an_axis_around_their_value(run_dir):
    pytest.importorskip("bokeh")
    from flowrl.metrics.dashboard import NODE_ORDER, Dashboard, flat_span, stable_color

    # a node's colour is its place in the built-in order, whatever else the step has
    assert stable_color("gen", NODE_ORDER) != stable_color("update_actor", NODE_ORDER)
    assert stable_color("my_node", NODE_ORDER) == stable_color("my_node", NODE_ORDER)
    assert flat_span([5e-4, 5e-4, float("nan")]) == pytest.approx(5e-5)
    assert flat_span([0.0, 0.0]) == 1.0 and flat_span([1.0, 2.0]) is None and flat_span([]) is None

    dash = Dashboard(run_dir, live=True)
    assert dash.tl_all.data["color"][0] == stable_color("gen", NODE_ORDER)
    figs = {m.name: m for m in dash.layout.references() if getattr(m, "name", None)}
    # actor/pg_loss is -0.5 at every step: an axis of span 0.05 around it, not Bokeh's -1.5..0.5
    assert figs["metric:actor/pg_loss"].y_range.default_span == pytest.approx(0.05)
    assert figs["metric:critic/score/mean"].y_range.default_span == 2.0  # varies: Bokeh's own range
    hover = [t for t in figs["metric:actor/pg_loss"].tools if type(t).__name__ == "HoverTool"][0]
    assert hover.tooltips[1][1].endswith("{%.4g}") and set(hover.formatters.values()) == {"printf"}
    # a step where the loss moves: the range follows the data again
    write_step(run_dir, 2, extra={"actor/pg_loss": -0.25})
    dash.update()
    assert figs["metric:actor/pg_loss"].y_range.default_span == 2.0
    assert "metric_filter" in figs


def test_find_runs_expands_a_directory_of_runs_and_labels_them(tmp_path):
    from flowrl.metrics.run_reader import find_runs, run_labels

    for name in ("b", "a"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "metrics.jsonl").write_text("")
    (tmp_path / "runs" / "notes").mkdir()  # not a run: skipped
    assert [p.name for p in find_runs([tmp_path / "runs"])] == ["a", "b"]
    assert [p.name for p in find_runs([tmp_path / "runs" / "b", tmp_path / "runs" / "a"])] == ["b", "a"]
    # runs at any depth (runs/<project>/<experiment>), not inside a run's own folders
    deep = tmp_path / "runs" / "proj" / "exp"
    (deep / "experience").mkdir(parents=True)
    (deep / "config.yaml").write_text("{}")
    (deep / "checkpoints" / "inner").mkdir(parents=True)
    (deep / "checkpoints" / "inner" / "metrics.jsonl").write_text("")
    assert [p.relative_to(tmp_path / "runs").as_posix() for p in find_runs([tmp_path / "runs"])] == \
        ["a", "b", "proj/exp"]
    # the fix names what to pass, not what the user passed ("a directory of runs")
    with pytest.raises(ValueError, match=r"notes: no flowrl run in it or below it .*fix: pass the directory a run "
                                         r"wrote \(its last line says 'run dir \.\.\.'; by default runs/<project>"):
        find_runs([tmp_path / "runs" / "notes"])
    with pytest.raises(ValueError, match="no such directory; fix: pass the directory a run wrote"):
        find_runs([tmp_path / "nope"])
    with pytest.raises(ValueError, match="named twice"):
        find_runs([tmp_path / "runs", tmp_path / "runs" / "a"])
    # equal directory names get their parents
    (tmp_path / "x" / "run").mkdir(parents=True)
    (tmp_path / "y" / "run").mkdir(parents=True)
    assert run_labels([tmp_path / "x" / "run", tmp_path / "y" / "run"]) == ["x/run", "y/run"]
    assert run_labels([tmp_path / "x" / "run"]) == ["run"]


def test_turn_texts_cut_the_response_at_turn_spans():
    from flowrl.metrics.run_reader import turn_texts

    def decode(pieces):
        return ["".join(chr(ord("a") + i) for i in p) for p in pieces]

    # model tokens 0..2, a tool answer 3..4, the model again 5
    assert turn_texts([0, 1, 2, 3, 4, 5], [[0, 3, 1], [3, 5, 0], [5, 6, 1]], decode) == [[1, "abc"], [0, "de"], [1, "f"]]
    assert turn_texts([0, 1], None, decode) == [[1, "ab"]]  # single turn: one model turn
    assert turn_texts([], None, decode) == []


def test_ema_is_tensorboards_debiased_average_and_skips_gaps():
    from flowrl.metrics.dashboard_figures import ema

    # weight 0.5: 1 -> 1; then (0.5*0.5 + 0.5*3) / (1 - 0.25) = 1.75/0.75 = 2.3333; NaN kept;
    # then (0.875 + 0.5*5)... last = 0.5*1.75 + 0.5*5 = 3.375, / (1 - 0.125) = 3.857
    out = ema([1.0, 3.0, math.nan, 5.0], 0.5)
    assert out[0] == pytest.approx(1.0) and out[1] == pytest.approx(7 / 3) and math.isnan(out[2])
    assert out[3] == pytest.approx(3.375 / 0.875)
    assert list(ema([1.0, 2.0], 0.0)) == [1.0, 2.0]


def test_two_runs_overlay_in_one_page_with_a_legend_and_a_run_selector(tmp_path):
    pytest.importorskip("bokeh")
    from flowrl.metrics.dashboard import Dashboard

    runs = []
    for name, score in (("a", 0.1), ("b", 0.2)):
        d = tmp_path / name
        d.mkdir()
        for step in range(2):
            write_step(d, step, extra={"critic/score/mean": score * step} | ({"only/b": 1.0} if name == "b" else {}))
        runs.append(d)
    dash = Dashboard(runs)
    assert dash.labels == ["a", "b"] and dash.run_select.visible and dash.run_select.value == "a"
    figs = {m.name: m for m in dash.layout.references() if getattr(m, "name", None)}
    fig = figs["metric:critic/score/mean"]
    assert [item.label.value for item in fig.legend[0].items] == ["a", "b"]
    # a key only run b has: run a's source holds NaN for it, so its figure still draws both
    assert "metric:only/b" in figs and all(math.isnan(v) for v in dash.metric_srcs[0].data["only/b"])
    assert list(dash.metric_srcs[1].data["critic/score/mean"]) == [0.0, 0.2]
    # the step section shows the chosen run's rows
    assert set(dash.smp_shown.data["run"]) == {"a"} and set(dash.tl_shown.data["run"]) == {"a"}
    assert "2 runs" in dash.header.text
    write_step(runs[1], 2)
    changes = dash.update()
    assert changes.new_sample_steps == [2] and list(dash.metric_srcs[1].data["step"]) == [0, 1, 2]
    # runs of different lengths (issue 35): the step selector offers the chosen run's steps, so
    # following the latest step never lands on one the run shown lacks (an empty table and Gantt)
    assert dash.step_select.options == ["0", "1"] and dash.step_select.value == "1"
    assert dash.smp_shown.data["uid"] == ["1-0", "1-1", "1-2"] and dash.tl_shown.data["node"]
    # a page whose first run has no step yet opens on the next run's
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.yaml").write_text("{}")
    late = Dashboard([tmp_path / "c", *runs])
    assert late.run_select.value == "a" and late.step_select.value == "1" and late.smp_shown.data["uid"]
    assert "log:metric:critic/score/mean" in figs and figs["smoothing"].value == 0.0


def test_a_page_opened_before_the_first_step_shows_every_figure_once_steps_come(tmp_path):
    """Issue 35: a live page opened on a run that has logged nothing yet (a server's session,
    ``defer``) lays out every panel's figures as the steps arrive, not only the overview's; the
    figures are built by ``refresh`` (a server's worker thread), the update only attaches them."""
    pytest.importorskip("bokeh")
    from flowrl.metrics.dashboard import Dashboard, grid_layout

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"trainer": {"total_training_steps": 3}}))
    dash = Dashboard(run, live=True, defer=True)
    assert not dash._pending and not dash._figures
    for step in (1, 2):
        write_step(run, step, extra={"reshard/bytes": 1024.0})
    found = dash.refresh()
    built = set(dash._figures)
    keys = sorted({k for line in (run / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)} - {"step"})
    assert built == {(panel, k) for panel, grid_keys in grid_layout(keys) for k in grid_keys}
    dash.update(found)
    assert set(dash._figures) == built  # nothing built on the loop
    shown = {fig.name for pane in (m for m in dash.layout.references() if type(m).__name__ == "Pane")
             for fig in pane.elements if type(fig).__name__ == "figure"}
    assert {f"metric:{k}" for k in keys} <= shown
    assert {"throughput:perf/throughput", "reshard:reshard/bytes", "overview:critic/score/mean"} <= shown


@pytest.mark.parametrize("first", [0, 1])
def test_a_run_counting_from_0_or_from_1_reads_the_same(tmp_path, first):
    """Issue 35: verl counts training steps from 1 and logs ``val_before_train`` at step 0 (a row
    of validation metrics alone); older flowrl runs count from 0. Both read as 3 training steps,
    the step selector offers the steps the run wrote and opens on its last."""
    pytest.importorskip("bokeh")
    from flowrl.metrics.dashboard import Dashboard

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"trainer": {"total_training_steps": 3}}))
    if first == 1:  # validation before training: its own row at step 0
        with open(run / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps({"step": 0, "val-core/arith/reward/mean@1": 0.25, "val-aux/num_samples": 8}) + "\n")
    steps = [first, first + 1, first + 2]
    for step in steps:
        write_step(run, step)
    reader = RunReader(run)
    reader.refresh()
    assert reader.training_steps == steps
    dash = Dashboard(run)
    assert "<b>3</b> / 3 steps logged" in dash.header.text
    assert "last critic/score/mean <b>" + f"{0.1 * steps[-1]:.4f}" in dash.header.text
    assert dash.step_select.options == [str(s) for s in steps] and dash.step_select.value == str(steps[-1])
    assert dash.smp_shown.data["uid"] == [f"{steps[-1]}-{i}" for i in range(3)]
    assert list(dash.metrics_src.data["step"]) == ([0] if first else []) + steps


def test_samples_note_says_when_the_table_keeps_a_steps_first_rows(run_dir):
    """Issue 35: a step of more rows than ``max_samples`` says how many it holds, not "64 samples"."""
    pytest.importorskip("bokeh")
    from flowrl.metrics.dashboard import Dashboard

    dash = Dashboard(run_dir, max_samples=2)  # each step wrote 3 rows
    assert dash.table_note.text == "step 1: the first 2 of 3 samples (flowrl dashboard --max-samples N shows more)"
    assert Dashboard(run_dir).table_note.text == "step 1: 3 samples"


def test_dask_link_only_while_it_answers_and_never_in_an_export(run_dir, tmp_path):
    """Issue 35: the header links the run's Dask dashboard on a live page while it answers (its
    /health); a stopped cluster's link is not drawn as a link, and an export has none."""
    pytest.importorskip("bokeh")
    import http.server
    import threading

    from flowrl.metrics.dashboard import Dashboard
    from flowrl.metrics.dashboard_server import export_html

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    link = f"http://127.0.0.1:{server.server_port}/status"
    (run_dir / "run_info.json").write_text(json.dumps({"dask_dashboard": link}))
    try:
        assert f"href='{link}'" in Dashboard(run_dir, live=True).header.text
        export = export_html(run_dir, tmp_path / "d.html").read_text()
        assert link not in export and "Dask dashboard" not in export
    finally:
        server.shutdown()
        server.server_close()
    page = Dashboard(run_dir, live=True)
    assert link not in page.header.text and "Dask dashboard: not answering" in page.header.text


def test_step_axes_tick_whole_steps_and_overlay_legends_sit_below_the_plot(run_dir, tmp_path):
    """Issue 35: no 0.5 ticks on a 3-step run; several runs' legend below the curves, not over them."""
    pytest.importorskip("bokeh")
    from flowrl.metrics.dashboard import Dashboard
    from flowrl.metrics.dashboard_figures import FIG_H

    figs = {m.name: m for m in Dashboard(run_dir).layout.references() if type(m).__name__ == "figure"}
    assert figs["metric:actor/pg_loss"].xaxis[0].ticker.min_interval == 1
    assert not figs["metric:actor/pg_loss"].legend
    other = tmp_path / "other"
    other.mkdir()
    write_step(other, 0)
    figs = {m.name: m for m in Dashboard([run_dir, other]).layout.references() if type(m).__name__ == "figure"}
    fig = figs["metric:actor/pg_loss"]
    assert fig.legend[0] in fig.below and not fig.center[2:] and fig.height > FIG_H
    assert fig.legend[0].orientation == "horizontal" and fig.legend[0].ncols == 2

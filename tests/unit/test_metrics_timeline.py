"""Node spans (flowrl.nodes.core._run_node), timeline.jsonl rows, metric-key grouping: pure, no cluster."""

import json

import pytest

from flowrl.metrics.groups import MISC, group_metrics, headline_keys, keys_of, metric_group
from flowrl.metrics.timeline import append_rows, parse_timeline, read_timeline, span_rows
from flowrl.nodes import core as nodes


def test_run_node_records_wall_clock_span_and_carries_upstream_spans():
    upstream = nodes.NodeOut("table", {"timing_s/gen": 1.0}, {"gen": (100.0, 101.0)})
    out = nodes._run_node("reward", lambda t: nodes.NodeOut(t + "!", {"reward/x": 2.0}), upstream)
    assert out.value == "table!"
    assert set(out.spans) == {"gen", "reward"} and out.spans["gen"] == (100.0, 101.0)
    start, end = out.spans["reward"]
    # the span is the node's own time: end - start == timing_s/reward
    assert end - start == pytest.approx(out.metrics["timing_s/reward"], abs=1e-6)  # float64 of ~1.8e9 s
    assert start >= 101.0  # wall clock (time.time()), after the fake upstream span
    assert set(out.metrics) == {"timing_s/gen", "reward/x", "timing_s/reward"}  # spans are not metrics


def test_span_rows_are_relative_to_submission_sorted_and_skip_written_nodes():
    spans = {"update": (10.5, 11.0), "gen": (10.1, 10.4), "sync": (11.0, 11.25)}
    rows = span_rows(7, 10.0, spans)
    # gen started 0.1 s after submission, update 0.5 s, sync 1.0 s
    assert [(r["node"], r["start"], r["end"]) for r in rows] == [("gen", 0.1, 0.4), ("update", 0.5, 1.0), ("sync", 1.0, 1.25)]
    assert {r["step"] for r in rows} == {7}
    assert [r["node"] for r in span_rows(7, 10.0, spans, skip={"gen", "update"})] == ["sync"]


def test_timeline_file_round_trip_tolerates_a_cut_line_and_keeps_the_last_row(tmp_path):
    path = tmp_path / "timeline.jsonl"
    append_rows(path, span_rows(0, 0.0, {"gen": (0.0, 1.0), "adv": (1.0, 1.5)}))
    append_rows(path, [])  # nothing written, no empty line
    append_rows(path, span_rows(0, 0.0, {"gen": (0.0, 2.0)}))  # a resumed run writes step 0 again
    with open(path, "a") as fh:
        fh.write('{"step": 1, "node": "gen", "sta')  # a crash mid-line
    rows = read_timeline(path)
    assert rows == [{"step": 0, "node": "gen", "start": 0.0, "end": 2.0, "origin": 0.0},
                    {"step": 0, "node": "adv", "start": 1.0, "end": 1.5, "origin": 0.0}]
    assert parse_timeline(["", "[1, 2]", json.dumps({"step": "x", "node": "a", "start": 0, "end": 1})]) == []
    assert read_timeline(tmp_path / "missing.jsonl") == []


def test_metric_keys_group_by_prefix_in_verl_order():
    keys = ["timing_s/gen", "actor/pg_loss", "num_tokens", "critic/score/mean", "perf/throughput", "zeta/x",
            "reshard/bytes", "actor/entropy", "val-core/math/reward/mean", "step", "alpha/y"]
    groups = group_metrics(keys)
    assert list(groups) == ["critic", "val-core", "actor", "timing_s", "perf", "reshard", "alpha", "zeta", MISC]
    assert groups["actor"] == ["actor/entropy", "actor/pg_loss"]
    assert groups["val-core"] == ["val-core/math/reward/mean"]
    assert groups[MISC] == ["num_tokens"] and "step" not in sum(groups.values(), [])
    assert metric_group("a/") == MISC and metric_group("/a") == MISC
    assert keys_of("perf", keys) == ["perf/throughput"]
    assert headline_keys(keys) == ["critic/score/mean", "actor/entropy", "perf/throughput"]


def test_overlapping_rows_put_the_generation_ahead_on_the_steps_clock():
    from flowrl.metrics.timeline import overlapping_rows

    # step 1 submitted at t=100: update 100.5..101.0; step 2 submitted at t=101, its generation
    # ran ahead at 100.6..100.9 (-0.4..-0.1 on its own clock): 0.6..0.9 on step 1's clock
    rows = span_rows(1, 100.0, {"gen": (99.5, 100.4), "update_actor": (100.5, 101.0)})
    rows += span_rows(2, 101.0, {"gen": (100.6, 100.9), "update_actor": (101.5, 102.0)})
    rows += span_rows(3, 102.0, {"gen": (101.2, 101.9)})  # after step 1 ended: not shown
    shown = overlapping_rows(rows, 1)
    assert [(r["node"], r["start"], r["end"]) for r in shown] == [
        ("gen", -0.5, 0.4), ("update_actor", 0.5, 1.0), ("gen (step 2)", pytest.approx(0.6), pytest.approx(0.9))]
    # rows without an origin (written before it was recorded): the step's own rows only
    old = [{k: v for k, v in r.items() if k != "origin"} | {"origin": None} for r in rows]
    assert [r["node"] for r in overlapping_rows(old, 1)] == ["gen", "update_actor"]

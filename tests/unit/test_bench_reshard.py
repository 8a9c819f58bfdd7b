"""The reshard benchmark's bookkeeping (pure): summary rows and the table.

The benchmark itself (a 79M-parameter model, minutes) is run by hand: ``python benchmarks/reshard.py``;
``tests/dist/test_reshard_bench_core.py`` runs its core on a tiny model.
"""

from __future__ import annotations

import pytest

from flowrl_testing.benchmarks import load_benchmark

bench = load_benchmark("reshard.py", "bench_reshard")


def _record(transport, moved, wall, peaks, exact=True):
    return {"case": "TP2 -> TP1", "placement": "colocated", "transport": transport, "model_bytes": 400,
            "bytes_moved": moved, "bytes_min": 200, "peak_extra_bytes": peaks, "peak_bound_bytes": 400 + 64,
            "wall_s": [wall, 2 * wall], "wall_s_median": wall, "exact": exact}


def test_summary_compares_planned_with_naive():
    rows = bench.summarize([_record("planned", 200, 1.0, [64, 32]), _record("naive", 600, 4.0, [800, 400])])
    (row,) = rows
    assert row["moved_over_min"] == 1.0  # 200 / 200
    assert row["peak_extra_bytes_max"] == 64 and row["peak_within_bound"]  # 64 <= 400 + 64
    assert row["naive_bytes_moved"] == 600 and row["naive_peak_extra_bytes_max"] == 800
    assert row["wall_over_naive"] == pytest.approx(0.25)  # 1.0 s / 4.0 s
    assert row["wall_over_naive_per_repeat"] == pytest.approx([0.25, 0.25])  # 2.0 / 8.0
    assert row["exact"]
    text = bench.format_table(rows)
    assert "TP2 -> TP1" in text and "0.250" in text


def test_summary_flags_a_wrong_shard_or_a_peak_over_the_bound():
    rows = bench.summarize([_record("planned", 200, 1.0, [999]), _record("naive", 600, 4.0, [1], exact=False)])
    assert not rows[0]["peak_within_bound"]  # 999 > 464
    assert not rows[0]["exact"]


def test_benchmark_model_is_at_least_50m_parameters():
    import math

    assert sum(math.prod(s) for s in bench.MODEL.param_shapes().values()) >= 50e6


def test_planning_benchmark_runs_on_a_tiny_model():
    # benchmarks/reshard_planning.py's core on a toy shape and small worlds (the real run, a 7B
    # shape up to 4,096 ranks, is run by hand): rows per (world, generation layout), the whole
    # plan listed only up to --whole-up-to, each busiest rank's plan checked against its row
    from flowrl.parallel.shard_spec import ModelShape

    planning = load_benchmark("reshard_planning.py", "bench_reshard_planning")
    toy = ModelShape(vocab_size=64, hidden_size=8, ffn_hidden_size=16, num_layers=4, num_heads=4,
                     num_kv_heads=2, head_dim=2)
    result = planning.run(model=toy, max_world=16, whole_up_to=8, repeats=1,
                          train={"tp": 2, "pp": 2}, gens=({"tp": 1}, {"tp": 2}), min_world=4)
    cases = result["cases"]
    assert [(c["world"], c["gen"]) for c in cases] == [
        (4, "dp=4,tp=1,pp=1"), (4, "dp=2,tp=2,pp=1"), (8, "dp=8,tp=1,pp=1"),
        (8, "dp=4,tp=2,pp=1"), (16, "dp=16,tp=1,pp=1"), (16, "dp=8,tp=2,pp=1")]
    assert all((c["whole_s"] is None) == (c["world"] > 8) for c in cases)
    assert all(c["bytes_sent"] == c["bytes_min"] > 0 and c["rank_transfers"] > 0 for c in cases)
    assert "summary s" in planning.format_table(cases) and "machine" in result

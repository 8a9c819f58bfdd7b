"""The throughput benchmark's bookkeeping (pure): cells, phases and FLOPs per phase.

The benchmark itself runs ``flowrl train`` per cell (minutes): ``python benchmarks/throughput.py``."""

from __future__ import annotations

import pytest

from flowrl_testing.benchmarks import load_benchmark

bench = load_benchmark("throughput.py", "bench_throughput")


def test_cells_parse_and_bad_ones_name_the_cell():
    assert bench.parse_cell("10m:8x8x64") == {"cell": "10m:8x8x64", "model": "10m", "prompts": 8, "samples": 8,
                                             "tokens": 64}
    assert bench.parse_cell("0.5b:1x2x3")["model"] == "0.5b"
    for bad, said in (("10m:8x8", "is not"), ("huge:1x1x1", "unknown"), ("10m:0x8x8", ">= 1"), ("10m", "is not")):
        with pytest.raises(SystemExit, match=said):
            bench.parse_cell(bad)


def test_phases_take_the_slower_log_prob_pass_and_leave_the_rest_to_overhead():
    m = {"timing_s/gen": 0.5, "timing_s/ref": 0.2, "timing_s/old_log_prob": 0.3, "timing_s/update_actor": 0.4,
         "timing_s/reward": 0.01, "timing_s/adv": 0.02, "timing_s/collect": 0.03, "timing_s/reshard": 0.25,
         "timing_s/step": 1.3}
    ph = bench.phases(m, wall=1.5)
    assert ph["log_probs"] == 0.3  # side by side: the slower one is on the path
    assert ph["reward_adv"] == pytest.approx(0.06)
    assert sum(ph.values()) == pytest.approx(1.5) and ph["overhead"] == pytest.approx(1.5 - 1.26)
    assert "weight_sync" not in ph  # overlapped with the driver's bookkeeping: reported, not summed


def test_phase_flops_count_forward_passes_and_the_update():
    from flowrl.metrics.mfu import ModelFlops

    flops = ModelFlops(dense_params=1000, attention=10)
    seqlens = [4, 6]
    train = 6 * 1000 * 10 + 6 * 10 * (16 + 36)
    both = bench.phase_flops(flops, seqlens, {"timing_s/ref": 1, "timing_s/old_log_prob": 1}, epochs=2)
    assert both == {"generation": pytest.approx(train / 3), "log_probs": pytest.approx(2 * train / 3),
                    "update": pytest.approx(2 * train)}
    assert bench.phase_flops(flops, seqlens, {}, epochs=1)["log_probs"] == 0  # no reference, no old pass


def test_the_cpu_peak_is_a_positive_rate():
    assert bench.cpu_peak_flops(64, repeats=2) > 1e6

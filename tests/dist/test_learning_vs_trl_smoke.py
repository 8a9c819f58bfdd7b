"""The learning benchmark (``benchmarks/learning_vs_trl.py``) end to end on a tiny model: both
frameworks train 2 steps from the same start model on the same prompts, and the one evaluator scores
their final weights. The benchmark itself (0.65M parameters, 300 steps, 3 seeds) is run by hand."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "learning_vs_trl.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_learning_vs_trl", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = load_bench()


def test_the_evaluator_sees_moved_weights(tmp_path):
    """KL to the start policy is 0 for the start model itself and positive once the weights move."""
    import torch

    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, tiny_preset

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, **tiny_preset("default"))
    for name in ("start", "moved"):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
    rows = bench.heldout_rows()[:16]
    same = bench.evaluate_policy(str(tmp_path / "start"), str(tmp_path / "start"), rows, num_samples=2)
    moved = bench.evaluate_policy(str(tmp_path / "moved"), str(tmp_path / "start"), rows, num_samples=2)
    assert same["kl_to_start"] == pytest.approx(0.0, abs=1e-6) and same["entropy"] > 0
    assert moved["kl_to_start"] > 1e-3 and 1 <= moved["response_length"] <= 8


@pytest.mark.timeout(900)
def test_both_frameworks_train_two_steps_and_are_scored_by_one_evaluator(tmp_path):
    from flowrl.models.tiny import tiny_preset

    task = bench.prepare(tmp_path, warmup_target=None, model_kwargs=tiny_preset("default"), max_warmup_steps=2)
    start = task["start"]
    assert start["kl_to_start"] == pytest.approx(0.0, abs=1e-6)  # the start model against itself
    assert 0.0 <= start["greedy_accuracy"] <= 1.0 and start["entropy"] > 0
    settings = bench.Settings(steps=2, num_prompts=4, group_size=4, lr=1e-2)
    specs = [bench.job_spec(tmp_path, task, "smoke", fw, 0, settings) for fw in bench.FRAMEWORKS]
    bench.write_train_parquet(Path(specs[0]["train_path"]), 0, 8)
    bench.run_jobs(specs, num_jobs=2)
    results = [json.loads(Path(s["result_path"]).read_text()) for s in specs]
    for r in results:  # the barely warmed model earns no reward: advantages 0, weights unchanged
        assert [p["lr"] for p in r["curve"]] == [1e-2, 1e-2], r["framework"]
        assert all(math.isfinite(p["reward"]) and p["entropy"] > 0 for p in r["curve"]), r["framework"]
        assert r["eval"]["kl_to_start"] == pytest.approx(0.0, abs=1e-5), r["framework"]
    assert all((Path(s["final_dir"]) / "config.json").exists() for s in specs)
    rows = bench.summarize(results, last=2)
    assert [r["framework"] for r in rows] == ["flowrl", "trl"]
    assert "held-out greedy per seed" in bench.report(task, rows)
    overrides = bench.flowrl_overrides(specs[0])
    assert "actor.optim.lr_scheduler_type=constant" in overrides and "data.shuffle=false" in overrides
    trl = bench.trl_settings(specs[1])
    assert trl["lr_scheduler_type"] == "constant" and trl["shuffle_dataset"] is False and trl["bf16"] is False
    assert dataclasses.asdict(settings)["betas"] == (0.9, 0.999)

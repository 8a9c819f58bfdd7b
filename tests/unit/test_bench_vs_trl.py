"""The flowrl-vs-TRL benchmark's bookkeeping: statistics, report and process CPU accounting.

The benchmark itself (two frameworks, minutes) is run by hand: ``python benchmarks/vs_trl.py``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _load_vs_trl():
    spec = importlib.util.spec_from_file_location("bench_vs_trl", BENCH_DIR / "vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)  # puts benchmarks/ on sys.path for its `_common` import
    return module


vs_trl = _load_vs_trl()
common = sys.modules["_common"]


def _block(framework: str, repeat: int, step_s: list[float], tokens: float = 100.0, cpu_s: float = 1.0) -> dict:
    steps = [
        {"step_s": s, "tokens": tokens, "mean_len": tokens / 10, "gen_s": s / 4, "rest_s": 3 * s / 4,
         "score": 0.0, "breakdown": {"x": s}}
        for s in step_s
    ]
    return {"framework": framework, "repeat": repeat, "steps": steps, "block_wall_s": sum(step_s), "cpu_s": cpu_s}


def test_summarize_medians_ratios_and_fastest_step():
    blocks = [
        _block("flowrl", 0, [1.0, 1.0]),  # 1.0 s/step, 100 tokens/s
        _block("trl", 0, [2.0, 2.0], cpu_s=4.0),  # 2.0 s/step
        _block("trl", 1, [3.0, 1.5], cpu_s=4.0),  # 2.25 s/step, fastest trl step 1.5
        _block("flowrl", 1, [1.5, 1.5]),
        _block("flowrl", 2, [0.5, 2.5]),  # 1.5 s/step, fastest flowrl step 0.5
        _block("trl", 2, [4.0, 4.0], cpu_s=4.0),
    ]
    s = vs_trl.summarize(blocks)
    # flowrl turns: 1.0, 1.5, 1.5 -> median 1.5; trl turns: 2.0, 2.25, 4.0 -> median 2.25
    assert s["flowrl"]["s_per_step"] == pytest.approx(1.5)
    assert s["trl"]["s_per_step"] == pytest.approx(2.25)
    assert s["speedup"] == pytest.approx(2.25 / 1.5)
    assert s["speedup_per_repeat"] == pytest.approx([2.0, 1.5, 4.0 / 1.5])
    assert s["speedup_fastest_step"] == pytest.approx(1.5 / 0.5)
    # CPU: flowrl 1.0 / 2 steps = 0.5 s/step; trl 4.0 / 2 = 2.0 -> 0.25
    assert s["cpu_s_ratio_flowrl_over_trl"] == pytest.approx(0.25)
    # tokens/s per turn = 200 tokens / turn time; flowrl median turn 1.5 s/step -> 100/1.5
    assert s["flowrl"]["tokens_per_s"] == pytest.approx(100 / 1.5)
    text = vs_trl.report("default", {"summary": s, "settings": {**vs_trl.dataclasses.asdict(vs_trl.SCALES["default"])}})
    assert "speedup" in text and "flowrl" in text and "trl" in text


def test_scales_hold_prompt_plus_response():
    for scale in vs_trl.SCALES.values():
        assert scale.max_position_embeddings >= 6 + scale.response_length  # "37+48=" is 6 tokens


def test_trl_settings_match_flowrl_overrides():
    spec = {"scale": vs_trl.dataclasses.asdict(vs_trl.SCALES["large"]), "common": vs_trl.dataclasses.asdict(vs_trl.Common()),
            "model_dir": "m", "train_path": "t", "run_dir": "r"}
    trl = vs_trl.trl_settings(spec)
    flowrl = dict(o.split("=", 1) for o in vs_trl.flowrl_overrides(spec))
    assert trl["per_device_train_batch_size"] == 4 * 8 and trl["gradient_accumulation_steps"] == 1
    assert trl["num_generations"] == int(flowrl["rollout.n"]) == 8
    assert trl["max_completion_length"] == int(flowrl["rollout.response_length"]) == 64
    assert trl["learning_rate"] == float(flowrl["actor.optim.lr"])
    assert trl["max_grad_norm"] == float(flowrl["actor.optim.grad_clip"])
    assert trl["beta"] == 0.0 and flowrl["actor.use_kl_loss"] == "false"
    assert trl["bf16"] is False and trl["gradient_checkpointing"] is False


def test_process_tree_cpu_counts_this_process():
    assert common.process_tree_cpu_s(os.getpid()) > 0.0


def test_grid_spans_the_issue_14_scales():
    cells = vs_trl.GRID.values()
    assert {c.preset for c in cells} == {"default", "10m"}
    assert {c.num_samples for c in cells} == {128, 1024}
    assert {c.response_length for c in cells} == {8, 128}
    assert all(c.spread_eos > 0 for c in cells)
    spec = {"scale": vs_trl.dataclasses.asdict(vs_trl.GRID["0.1M-128x8"]), "common": vs_trl.dataclasses.asdict(vs_trl.Common()),
            "model_dir": "m", "train_path": "t", "run_dir": "r"}
    # flowrl at its defaults (issue 30): no batching, micro-batch or placement keys on its side
    speed = ("dynamic_bsz", "max_token_len", "prefix_grouper", "micro_batch_size", "cluster.", "rollout.name")
    assert not [o for o in vs_trl.flowrl_overrides(spec) if any(k in o for k in speed)]
    flagged = vs_trl.flowrl_overrides({**spec, "flowrl_flags": ["actor.use_dynamic_bsz=false"]})
    assert flagged[-1] == "actor.use_dynamic_bsz=false"


def test_trl_padding_counts_slots_per_real_token():
    import torch

    # 2 rows, prompts 3 and 2 tokens (padded to 3); completions 4 and 1 tokens (padded to 4)
    prompt = torch.tensor([[1, 1, 1], [0, 1, 1]])
    completion = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    pad = vs_trl.trl_padding(prompt, completion)
    # decode: 2 x (3 + 3) slots for 5 prompt + (3 + 0) fed completion tokens = 12 / 8
    assert pad["gen_padding_ratio"] == pytest.approx(12 / 8)
    # train: 2 x 7 slots for 5 + 5 real tokens
    assert pad["train_padding_ratio"] == pytest.approx(14 / 10)


def test_spread_eos_stops_responses_at_different_lengths(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    mean = vs_trl.spread_eos(model, 1, target_mean=8.0, max_new=16, iters=8)
    assert 5.0 <= mean <= 11.0, mean

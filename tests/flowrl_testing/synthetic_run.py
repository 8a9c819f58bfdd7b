"""A run directory written without training, for the dashboard's tests and its render benchmark.

``write_synthetic_run(path, steps)`` writes what flowrl's trainer writes: ``config.yaml``
(``model.path`` a saved character tokenizer, so samples decode), ``metrics.jsonl`` with the keys
of a default GRPO run (verl's names, the same ~50 keys; reward rising, entropy falling, a constant
learning rate, reshard byte counts from step 1, a validation score every 10 steps),
``timeline.jsonl`` (with ``origin``; ``staleness=1`` puts each step's generation during the
previous step's update, as the trainer's generations ahead do) and experience Parquet for the
last ``sample_steps`` steps (``agent=True``: multi-turn rows with ``turn_spans``, tool calls and a
calculator answer, as the rollout role's agent loop writes them).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from flowrl.data import experience as ex

#: The keys of a default GRPO run's metrics.jsonl (staleness 0, KL loss on), besides ``step``.
DEFAULT_RUN_KEYS = (
    "actor/entropy", "actor/grad_norm", "actor/kl_coef", "actor/kl_loss", "actor/lr", "actor/num_optimizer_steps",
    "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/pg_loss", "actor/ppo_kl", "actor/update_s",
    "compute_s/gen", "compute_s/ref", "compute_s/reshard", "compute_s/update_actor",
    "critic/advantages/max", "critic/advantages/mean", "critic/advantages/min",
    "critic/score/max", "critic/score/mean", "critic/score/min",
    "num_response_tokens", "num_samples", "num_tokens", "perf/throughput", "perf/time_per_step",
    "prompt_length/mean", "reshard/bytes", "reshard/bytes_min", "reshard/peak_extra_bytes",
    "response_length/max", "response_length/mean", "response_length/min", "rollout/logprob_diff_max",
    "timing_per_token_ms/gen", "timing_s/adv", "timing_s/collect", "timing_s/gen", "timing_s/ref",
    "timing_s/reshard", "timing_s/reward", "timing_s/step", "timing_s/update_actor", "training/global_step",
)
NODES = (("gen", 0.9), ("reward", 0.01), ("ref", 0.2), ("adv", 0.01), ("update_actor", 0.6), ("collect", 0.001))


def _metrics_row(step: int, steps: int, rng: np.random.Generator, lift: float) -> dict:
    t = step / max(steps - 1, 1)
    score = min(1.0, max(0.0, 0.15 + lift * (1 - math.exp(-4 * t)) + rng.normal(0, 0.05)))
    length = 4.0 + 2 * t + rng.normal(0, 0.3)
    gen, update = 0.9 + rng.normal(0, 0.05), 0.6 + rng.normal(0, 0.05)
    step_s = gen + update + 0.25
    row = {
        "step": step, "actor/entropy": 2.8 - 1.2 * t + rng.normal(0, 0.02), "actor/grad_norm": float(rng.lognormal(0.5, 0.4)),
        "actor/kl_coef": 0.001, "actor/kl_loss": 0.02 * t + abs(rng.normal(0, 0.002)), "actor/lr": 5e-4,
        "actor/num_optimizer_steps": 1.0, "actor/pg_clipfrac": abs(rng.normal(0.01, 0.005)), "actor/pg_clipfrac_lower": 0.0,
        "actor/pg_loss": rng.normal(0, 0.05), "actor/ppo_kl": abs(rng.normal(0, 1e-4)), "actor/update_s": update * 0.8,
        "compute_s/gen": gen * 0.7, "compute_s/ref": 0.15, "compute_s/update_actor": update * 0.9,
        "critic/advantages/max": 1.5, "critic/advantages/mean": rng.normal(0, 0.01), "critic/advantages/min": -0.87,
        "critic/score/max": 1.0, "critic/score/mean": score, "critic/score/min": 0.0,
        "num_response_tokens": 32 * length, "num_samples": 32.0, "num_tokens": 32 * (length + 6),
        "perf/throughput": 32 * length / step_s, "perf/time_per_step": step_s, "prompt_length/mean": 6.0,
        "response_length/max": length + 3, "response_length/mean": length, "response_length/min": max(1.0, length - 2),
        "rollout/logprob_diff_max": abs(rng.normal(0, 1e-6)), "timing_per_token_ms/gen": 1000 * gen / (32 * length),
        "timing_s/adv": 0.01, "timing_s/collect": 0.001, "timing_s/gen": gen, "timing_s/ref": 0.2,
        "timing_s/reward": 0.01, "timing_s/step": step_s, "timing_s/update_actor": update, "training/global_step": step + 1.0,
    }
    if step > 0:  # the previous step's weight sync, collected with this one
        row.update({"compute_s/reshard": 0.1, "reshard/bytes": 1038336.0, "reshard/bytes_min": 1038336.0,
                    "reshard/peak_extra_bytes": 305152.0, "timing_s/reshard": 0.15})
    if step % 10 == 0:
        row["val-core/arithmetic/reward/mean"] = score * 0.9
    return row


def _timeline_rows(step: int, origin: float, staleness: int) -> list[dict]:
    """Node spans relative to the step's submission at ``origin``. With staleness, the step's
    generation ran ahead: during the previous step's update (negative start)."""
    rows, t = [], 0.0
    for node, took in NODES:
        if node == "gen" and staleness and step > 0:
            rows.append({"step": step, "node": node, "start": -0.95, "end": round(-0.95 + took, 6), "origin": origin})
            continue
        rows.append({"step": step, "node": node, "start": round(t, 6), "end": round(t + took, 6), "origin": origin})
        t += took
    rows.append({"step": step, "node": "reshard", "start": round(t, 6), "end": round(t + 0.15, 6), "origin": origin})
    return rows


def _samples(step: int, rows: int, tokenizer, agent: bool, rng: np.random.Generator) -> pa.Table:
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    cols: dict[str, list] = {k: [] for k in ("uid", "group", "data_source", "ground_truth", "prompt_ids", "response_ids",
                                             "score", "advantages", "num_turns", "tool_calls", "turn_spans")}
    for i in range(rows):
        a, b = int(rng.integers(10, 99)), int(rng.integers(10, 99))
        right = bool(rng.random() < 0.5)
        answer = str(a + b if right else a + b + 1)
        if agent:
            turns = [(f'<tool_call>{{"name":"calculator","arguments":{{"expression":"{a}+{b}"}}}}</tool_call>', 1),
                     (f"\n={a + b}\n", 0), (answer, 1)]
        else:
            turns = [(answer, 1)]
        ids, spans = [], []
        for text, kind in turns:
            piece = enc(text)
            spans.append([len(ids), len(ids) + len(piece), kind])
            ids += piece
        adv = 0.5 if right else -0.5
        cols["uid"].append(f"s{step}-p{i // 4}-{i % 4}")
        cols["group"].append(i // 4)
        cols["data_source"].append("arithmetic")
        cols["ground_truth"].append(str(a + b))
        cols["prompt_ids"].append(enc(f"{a}+{b}="))
        cols["response_ids"].append(ids)
        cols["score"].append(1.0 if right else 0.0)
        cols["advantages"].append([adv] * len(ids))
        cols["num_turns"].append(sum(k for _, _, k in spans))
        cols["tool_calls"].append(len(turns) // 2)
        cols["turn_spans"].append(spans)
    return pa.table({
        "uid": cols["uid"], "group": pa.array(cols["group"], pa.int64()), "data_source": cols["data_source"],
        "ground_truth": cols["ground_truth"], "prompt_ids": pa.array(cols["prompt_ids"], ex.TOKEN_IDS),
        "response_ids": pa.array(cols["response_ids"], ex.TOKEN_IDS), "score": pa.array(cols["score"], pa.float32()),
        "advantages": pa.array(cols["advantages"], ex.TOKEN_FLOATS), "num_turns": pa.array(cols["num_turns"], pa.int32()),
        "tool_calls": pa.array(cols["tool_calls"], pa.int32()),
        "turn_spans": pa.array(cols["turn_spans"], pa.list_(pa.list_(pa.int32()))),
    })


def write_synthetic_run(path: str | Path, steps: int, *, seed: int = 0, lift: float = 0.55, staleness: int = 0,
                        agent: bool = False, sample_steps: int = 3, rows_per_step: int = 16,
                        tokenizer_dir: str | Path | None = None, keys: tuple[str, ...] | None = None) -> Path:
    """Write a run directory of ``steps`` steps at ``path`` (see the module docstring); returns it.
    ``lift``: how far the mean score rises; ``tokenizer_dir``: a saved tokenizer to share between
    runs (default: one saved inside the run); ``keys``: only these metric keys (fewer figures: a
    faster page for the browser tests)."""
    from flowrl.models.char_tokenizer import build_char_tokenizer

    run = Path(path)
    (run / "experience").mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    if tokenizer_dir is None:
        tokenizer_dir = run / "tokenizer"
        tokenizer.save_pretrained(tokenizer_dir)
    config = {"model": {"path": str(tokenizer_dir)}, "algorithm": {"adv_estimator": "grpo"},
              "trainer": {"total_training_steps": steps, "staleness": staleness},
              "rollout": {"multi_turn": {"enable": agent}}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    rng = np.random.default_rng(seed)
    origin0 = 1_780_000_000.0
    with open(run / "metrics.jsonl", "w") as metrics, open(run / "timeline.jsonl", "w") as timeline:
        for step in range(steps):
            row = _metrics_row(step, steps, rng, lift)
            if keys is not None:
                row = {k: v for k, v in row.items() if k == "step" or k in keys}
            metrics.write(json.dumps(row) + "\n")
            origin = origin0 + (1.0 if staleness else 2.0) * step  # generations ahead shorten the step
            timeline.writelines(json.dumps(r) + "\n" for r in _timeline_rows(step, origin, staleness))
    for step in range(max(0, steps - sample_steps), steps):
        pq.write_table(_samples(step, rows_per_step, tokenizer, agent, rng), ex.step_path(run, step))
    return run

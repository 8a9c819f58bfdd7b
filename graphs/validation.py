"""Validation: every ``trainer.test_freq`` steps, generate on held-out prompts and score them.

The graph of one validation is three nodes on the training run's groups::

    samples = generate rollout.val_kwargs.n responses per held-out prompt   on rollout
    scored  = score each response with the reward function                  (a plain task)
    report  = val-core metrics per data source, and the samples to write     (a plain task)

Greedy by default (``rollout.val_kwargs.do_sample=false``), as verl. The rollout group runs its
calls in reserved order, so a validation built after step k's graph sees step k's weights.
Metrics follow verl's names: ``val-core/<data_source>/reward/mean@<n>`` (and ``best@<n>/mean``
for n > 1), ``val-aux/response_length/mean``. Samples go to ``validation/step_XXXXXX.jsonl``
under the run directory (``XXXXXX`` = steps trained so far), one JSON object per response.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from flowrl import nodes
from flowrl.config import RunConfig
from flowrl.data import experience
from flowrl.metrics import names
from flowrl.nodes import NodeOut, node

VALIDATION_DIR = "validation"


def val_sampling(cfg: RunConfig) -> Any:
    """The sampling parameters of validation, from ``rollout.val_kwargs``."""
    from flowrl.backends.interfaces import SamplingParams

    v = cfg.rollout.val_kwargs
    return SamplingParams.from_section(v, max_new_tokens=cfg.rollout.response_length, greedy=not v.do_sample)


def samples_path(run_dir: str | Path, step: int) -> Path:
    """Where the samples of the validation after ``step`` training steps go."""
    return Path(run_dir) / VALIDATION_DIR / f"step_{step:06d}.jsonl"


def build_validation(cfg: RunConfig, rollout: Any, prompts: pa.Table, *, step: int, tokenizer_dir: str) -> Any:
    """The (uncomputed) validation graph after ``step`` training steps; computes to
    ``NodeOut(sample rows, metrics)``. Build it between training graphs, in call order."""
    sampling = val_sampling(cfg)
    samples = node("val_gen", nodes.generate_val, rollout.bind(), prompts, sampling, seed=cfg.trainer.seed * 7919 + step, step=step)
    scored = node("val_reward", nodes.reward, samples, tokenizer_dir, cfg.algorithm.reward_fn,
                  cfg.reward_model.reward_timeout_s, step=step)
    return node("val_report", report, scored, tokenizer_dir, sampling.n, step=step)


def report(table: pa.Table, tokenizer_dir: str, n: int) -> NodeOut:
    """verl-style validation metrics, and one plain row per response to write."""
    tok = nodes.load_tokenizer(tokenizer_dir)
    prompts = tok.batch_decode(table.column("prompt_ids").to_pylist(), skip_special_tokens=True)
    responses = tok.batch_decode(table.column("response_ids").to_pylist(), skip_special_tokens=True)
    rows = [
        {"data_source": src, "group": int(g), "prompt": p, "response": r, "ground_truth": truth, "score": float(s)}
        for src, g, p, r, truth, s in zip(
            table.column("data_source").to_pylist(), table.column("group").to_pylist(), prompts, responses,
            table.column("ground_truth").to_pylist(), table.column("score").to_pylist(),
        )
    ]
    return NodeOut(rows, validation_metrics(table, n))


def validation_metrics(table: pa.Table, n: int) -> dict[str, float]:
    """``val-core/<data_source>/reward/mean@n`` per data source (mean score of all responses) and,
    for n > 1, ``best@n/mean`` (mean over prompts of the best of its n scores);
    ``val-aux/response_length/mean``."""
    scores = table.column("score").to_numpy().astype(np.float64)
    sources = np.asarray(table.column("data_source").to_pylist(), dtype=object)
    groups = table.column("group").to_numpy()
    out: dict[str, float] = {}
    for src in sorted(set(sources)):
        pick = sources == src
        out[names.val_mean(src, n)] = float(scores[pick].mean())
        if n > 1:
            best = [scores[pick & (groups == g)].max() for g in np.unique(groups[pick])]
            out[names.val_best(src, n)] = float(np.mean(best))
    out[names.VAL_RESPONSE_LENGTH_MEAN] = float(experience.lengths(table, "response_ids").mean())
    out[names.VAL_NUM_SAMPLES] = float(table.num_rows)
    return out


def load_val_prompts(cfg: RunConfig, tokenizer: Any) -> pa.Table:
    """Every usable prompt of ``data.val_files`` with a ``group`` id per prompt."""
    from flowrl.data.prompts import PromptDataset

    ds = PromptDataset(cfg.data.val_files.split(","), tokenizer, prompt_key=cfg.data.prompt_key,
                       max_prompt_length=cfg.data.max_prompt_length, tools=cfg.rollout.multi_turn.chat_tools())
    table = ds.table
    if cfg.data.val_max_samples > 0:
        table = table.slice(0, cfg.data.val_max_samples)
    return experience.with_columns(table, group=pa.array(np.arange(table.num_rows, dtype=np.int64)))


def write_samples(run_dir: str | Path, step: int, rows: list[dict]) -> Path:
    """Write ``rows`` (one JSON object per response) to :func:`samples_path`, atomically."""
    path = samples_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)
    return path

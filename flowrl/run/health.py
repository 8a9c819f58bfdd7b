"""The run's checks of itself (``trainer.checks``, :mod:`flowrl.checks`): built from the config,
with the bounds each check compares against."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from flowrl.checks import Limits, StepChecks
from flowrl.checks.base import skipped
from flowrl.config import RunConfig


def lag_bound(cfg: RunConfig) -> tuple[int, str]:
    """The largest weight-version lag a trained row may have, and where it comes from.

    Generations ahead (``trainer.staleness`` = N): N. Stream mode: N too (the queue refuses
    older requests), and at most what the queue can hold ahead: a request of step k is
    submitted while step k - j is built (version k - j) only if steps k - j .. k fit in the
    queue, so j <= ceil(max_queue_size / train_batch_size) - 1."""
    t = cfg.trainer
    if t.async_mode != "stream":
        return t.staleness, f"trainer.staleness={t.staleness}"
    ahead = math.ceil(cfg.stream_queue_size / cfg.data.train_batch_size) - 1
    if ahead < t.staleness:
        return ahead, f"trainer.max_queue_size={cfg.stream_queue_size} holds {ahead} steps ahead"
    return t.staleness, f"trainer.staleness={t.staleness}"


def open_checks(cfg: RunConfig, run_dir: str | Path | None = None) -> StepChecks:
    """The checks ``trainer.checks`` enables, with the run's bounds; with ``run_dir``, their last
    results go to its ``health.json`` (the dashboard's health panel)."""
    c = cfg.trainer.checks
    bound, source = lag_bound(cfg)
    limits = Limits(max_lag=bound, lag_source=source, no_signal_steps=c.reward_signal_steps,
                    logprob_kl_max=c.logprob_kl_max)
    return StepChecks(c.modes(), limits, run_dir=run_dir)


def check_at_start(checks: StepChecks, cfg: RunConfig, tokenizer: Any) -> None:
    """The checks that run once, before any worker starts: the chat template's round trip of a
    multi-turn tool conversation (``trainer.checks.chat_template``)."""
    if checks.start_modes["chat_template"] == "off":
        return
    mt = cfg.rollout.multi_turn
    if not mt.enable:
        checks.record("chat_template", skipped("single-turn rollouts"))
        return
    from flowrl.agents.loop import ChatCodec
    from flowrl.checks.template import round_trip

    checks.record("chat_template", round_trip(tokenizer, ChatCodec(tokenizer).observation_ids, mt.chat_tools()))

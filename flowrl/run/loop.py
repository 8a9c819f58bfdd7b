"""The training loop: ``trainer.total_training_steps`` iterations, logged, checkpointed, recovered.

:func:`train` resolves and checks the inputs (before any worker starts), opens the run, and per
step: runs the iteration, validates when due, logs (``metrics.jsonl`` always), saves when due.
Steps are numbered as verl numbers them, in every sink: training steps 1 .. total, and
``trainer.val_before_train`` at step 0, a row of its own. The loop's index (0-based, what the
data order and the seeds are functions of) is one less than the step it logs.
After each step the run checks itself (``trainer.checks``, ``flowrl.checks``): the checks'
metrics join the step's row, a ``health:`` line follows the console line, and a failed check in
``error`` mode stops the run once the step is logged (before its checkpoint), naming what diverged.
A failed step goes to the recovery state machine (``flowrl.run.recovery``): a real error ends the
run; a lost worker rebuilds it from the last checkpoint, and the steps since then run again
(their rows are dropped from ``metrics.jsonl`` and ``timeline.jsonl`` first).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from flowrl.checks import CheckFailed, StepChecks
from flowrl.config import RunConfig
from flowrl.config.batching_auto import describe_batching
from flowrl.metrics import names
from flowrl.metrics.logger import drop_rows_from
from flowrl.metrics.timeline import TIMELINE_FILE
from flowrl.run.driver import Run, epoch_steps
from flowrl.run.health import check_at_start
from flowrl.run.preflight import resolve_inputs
from flowrl.run.recovery import Recovery
from flowrl.run.topology import describe_placement
from flowrl.run import signals

METRICS_FILE = "metrics.jsonl"
__all__ = ["METRICS_FILE", "RunSummary", "epoch_steps", "train"]


@dataclass
class RunSummary:
    run_dir: Path
    steps: int
    first_score: float  # mean critic/score/mean over the first ``window`` steps
    last_score: float  # ... and over the last ``window`` steps
    tokens_per_s: float
    wall_s: float
    history: list[dict[str, float]] = field(default_factory=list, repr=False)
    restarts: int = 0  # worker groups rebuilt after a lost worker (trainer.max_restarts)
    window: int = 5  # steps averaged at each end: up to 5, and never overlapping (half a short run)
    health: str = ""  # the checks' last results (``health: staleness=ok ...``, flowrl.checks)

    def text(self) -> str:
        if self.steps >= 2:
            k = self.window
            score = (f"mean score first {k} step{'s' * (k > 1)} {self.first_score:.3f} -> last {k} "
                     f"step{'s' * (k > 1)} {self.last_score:.3f} ({self.last_score - self.first_score:+.3f})")
        else:  # one step (or none: resumed at the end) has nothing to compare
            score = f"mean score {self.last_score:.3f}"
        if math.isnan(self.last_score):  # nothing scored (a supervised family): its losses are in the metrics
            done = f"done: {self.steps} steps in {self.wall_s:.1f}s | run dir {self.run_dir}"
        else:
            done = (f"done: {self.steps} steps in {self.wall_s:.1f}s | {score} | "
                    f"{self.tokens_per_s:.0f} tokens/s | run dir {self.run_dir}")
        return f"{done}\n{self.health}" if self.health else done


class _Sinks:
    """The loggers (``metrics.jsonl`` always, console lines through the progress bar while
    there is one) and the bar; reopened after a rebuild drops rows."""

    def __init__(self, cfg: RunConfig, run: Run) -> None:
        self.cfg, self.run_dir, self.bar = cfg, run.run_dir, None
        self.logger = self._open()

    def start_bar(self, first: int) -> None:
        """``trainer.progress``: a bar from step ``first`` (once the workers are up), on a
        terminal only (redraws would fill a log with ``\\r`` lines)."""
        if self.cfg.trainer.progress and sys.stderr.isatty():  # a log file gets the step lines only
            from tqdm import tqdm

            total = self.cfg.trainer.total_training_steps
            self.bar = tqdm(total=total, initial=min(first, total), desc="train", unit="step", dynamic_ncols=True)

    def _open(self) -> Any:
        from flowrl.metrics import open_loggers

        from flowrl.config import to_dict

        t = self.cfg.trainer
        return open_loggers(t.logger, self.run_dir, total=t.total_training_steps,
                            write=lambda line: self.bar.write(line) if self.bar is not None else print(line, flush=True),
                            project=t.project_name, experiment=t.experiment_name,
                            config=to_dict(self.cfg) if "wandb" in t.logger else None)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.logger.log(step, metrics)

    def note(self, line: str) -> None:
        """A line after the step's console line (the ``health:`` line), with the ``console`` logger."""
        if "console" in self.cfg.trainer.logger:
            self.bar.write(line) if self.bar is not None else print(line, flush=True)

    def advance(self, metrics: dict[str, float]) -> None:
        if self.bar is not None:
            if names.SCORE_MEAN in metrics:  # a supervised family scores nothing
                self.bar.set_postfix(score=f"{metrics[names.SCORE_MEAN]:.3f}")
            self.bar.update(1)

    def rewind(self, step: int) -> None:
        """Steps after ``step`` (the number of steps the rebuilt run has trained) run again:
        their rows go (a ``val_before_train`` row at step 0 stays)."""
        self.logger.close()
        for name in (METRICS_FILE, TIMELINE_FILE):
            drop_rows_from(self.run_dir / name, step + 1)
        self.logger = self._open()
        if self.bar is not None:
            self.bar.n = step
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.logger.close()


def train(cfg: RunConfig, *, on_step: Callable[[int, dict[str, float]], None] | None = None) -> RunSummary:
    """Run ``trainer.total_training_steps`` iterations (or ``trainer.total_epochs`` passes);
    returns the summary."""
    if cfg.cluster.kind == "local":  # its workers import the main script again: refused before anything starts
        from flowrl.actors.main_guard import check_main_guard

        check_main_guard("train")
    cfg = resolve_inputs(cfg)
    start = time.perf_counter()
    run = _open_run(cfg)  # dataset, run dir, family and resume checkpoint checked before any worker starts
    first = run.next_step  # steps trained: the run goes on with step first + 1
    print(describe_placement(run.cfg), flush=True)  # e.g. "placement: hybrid (auto)"
    print("\n".join(describe_batching(run.cfg)), flush=True)  # what batching auto chose
    from flowrl.config.free_cache_auto import describe_free_cache

    print(describe_free_cache(run.cfg), flush=True)  # rollout.free_cache_engine=auto: what it chose and why
    if run.resume_from is not None:
        print(f"resumed from step {first} ({run.resume_from})", flush=True)  # its checkpoint: step_<first>
    for name in (METRICS_FILE, TIMELINE_FILE):  # steps this run writes again (from 0, val_before_train, when fresh)
        drop_rows_from(run.run_dir / name, first + 1 if first else 0)
    history: list[dict[str, float]] = []
    checks = run.checks  # trainer.checks (flowrl.run.health): Run.step runs them
    try:
        check_at_start(checks, run.cfg, run.tokenizer)  # multi-turn: the chat template's round trip
    except BaseException:
        run.close()
        raise
    sinks = _Sinks(run.cfg, run)
    recovery = Recovery(cfg.trainer.max_restarts, run.resume_from)
    restore_signal = signals.install(cfg.trainer.save_on_signal)  # issue 18: trainer.save_on_signal
    try:
        run.start_workers()
        sinks.start_bar(first)
        if first == 0 and cfg.trainer.val_before_train and run.val_prompts is not None:
            sinks.log(0, run.validate())  # verl logs the untrained policy's val-core/... at step 0
        _loop(run, sinks, recovery, checks, history, first, on_step)
    finally:
        restore_signal()
        sinks.close()
        run.close()
    summary = _summary(run, history, time.perf_counter() - start, recovery.restarts)
    summary.health = checks.health_line()
    return summary


def _open_run(cfg: RunConfig) -> Run:
    """``Run(cfg)``; a prompt file without a usable row is a config error. (``run.cfg`` is
    final: ``trainer.total_epochs`` became a step count before the family was built.)"""
    from flowrl.config import ConfigError
    from flowrl.data.prompts import NoUsablePrompts, OverlongPrompt

    d = cfg.data
    try:
        run = Run(cfg)
    except NoUsablePrompts as exc:
        if exc.too_long:
            raise ConfigError("data.max_prompt_length", d.max_prompt_length,
                              f"rejects every prompt of data.train_files (the longest has {exc.longest} tokens)",
                              f"raise it, e.g. data.max_prompt_length={exc.longest}, or set "
                              "data.filter_overlong_prompts=false with data.truncation=left") from None
        raise ConfigError("data.train_files", d.train_files, str(exc), "fix the rows (rejected_prompts.jsonl)") from None
    except OverlongPrompt as exc:
        raise ConfigError("data.truncation", d.truncation, str(exc),
                          "raise data.max_prompt_length, set data.filter_overlong_prompts=true, or "
                          "data.truncation=left|right|middle") from None
    return run


def _loop(run: Run, sinks: _Sinks, recovery: Recovery, checks: StepChecks, history: list[dict[str, float]],
          first: int, on_step: Callable[[int, dict[str, float]], None] | None) -> None:
    """Steps ``first`` .. ``total_training_steps - 1`` (0-based); each is logged as verl's step
    ``index + 1`` (``on_step`` gets that number too), then checked (``CheckFailed`` ends the run)."""
    t = run.cfg.trainer
    step = first
    while step < t.total_training_steps:
        try:
            table, metrics = run.step(enforce=False)  # checked: checks/<name> (trainer.checks)
            metrics.update(run.validate_if_due(step))  # trainer.test_freq: val-core/... metrics
            history.append(metrics)
            sinks.log(step + 1, metrics)
            sinks.note(checks.health_line())
            if on_step is not None:
                on_step(step + 1, metrics)
            checks.enforce()  # a failed check in error mode: the step is logged, not checkpointed
            if t.save_freq > 0 and ((step + 1) % t.save_freq == 0 or step + 1 == t.total_training_steps):
                recovery.saved(run.save_checkpoint())
        except CheckFailed:
            raise  # the run is wrong, not its workers: no rebuild
        except Exception as exc:  # noqa: BLE001 - re-raised by the recovery unless a worker was lost
            restart = recovery.on_failure(exc, step, run.session)
            run.rebuild(restart.checkpoint, restart.resume_step)
            step = restart.resume_step
            del history[step - first:]
            sinks.rewind(step)
            checks.rewind()
            recovery.rebuilt(step)
            continue
        sinks.advance(metrics)
        step += 1
        if signals.stop_after_step(run, recovery):  # issue 18: trainer.save_on_signal (flowrl.run.signals)
            break


def _summary(run: Run, history: list[dict[str, float]], wall_s: float, restarts: int) -> RunSummary:
    # nan: resumed at the end, or a supervised family (sft, dpo, rm), which scores nothing
    scores = [m.get(names.SCORE_MEAN, float("nan")) for m in history] or [float("nan")]
    k = max(1, min(5, len(scores) // 2))  # the two ends never share a step
    gen_tokens = sum(m.get(names.NUM_RESPONSE_TOKENS, 0.0) for m in history)
    gen_time = sum(m[names.STEP_TIME] for m in history) if gen_tokens else 0.0
    return RunSummary(run_dir=run.run_dir, steps=len(history), first_score=sum(scores[:k]) / k,
                      last_score=sum(scores[-k:]) / k, tokens_per_s=gen_tokens / gen_time if gen_time else 0.0,
                      wall_s=wall_s, history=history, restarts=restarts, window=k)

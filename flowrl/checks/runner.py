"""The checks of a run: each enabled check over every finished step, its metrics, the health
line, and the stop for a failed check in ``error`` mode."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Mapping

from flowrl.checks.base import CHECKS, MODES, CheckFailed, Limits, StepData, Verdict

log = logging.getLogger(__name__)

PREFIX = "checks/"
START_CHECKS = {"chat_template": "warn", "resume": "error"}
"""Checks run once when the run opens (:meth:`StepChecks.record`), with their default modes:
``chat_template`` (:func:`flowrl.checks.template.round_trip`, multi-turn rollouts), ``resume``
(:mod:`flowrl.checks.resume`: the restored state against its checkpoint's record)."""
STATES = ("ok", "warn", "failed", "n/a", "off", "not run")
"""A check's last result: passed; failed in ``warn`` mode (the run went on); failed in ``error``
mode (the run stopped); nothing to check; ``off``; no step checked yet."""
WORDS = {"ok": "ok", "warn": "WARN", "failed": "FAIL", "n/a": "n/a", "off": "off", "not run": "-"}
"""Each state as the ``health:`` line writes it."""
TIME = "checks/time_s"
"""The checks' own wall time in the step (the benchmark holds it under 3 % of ``timing_s/step``)."""


class StepChecks:
    """``modes``: check name -> ``off`` | ``warn`` | ``error`` (every registered check named);
    ``limits``: the run's bounds. Call :meth:`observe` after each step, then :meth:`enforce`
    once the step is logged."""

    def __init__(self, modes: Mapping[str, str], limits: Limits, *, run_dir: str | Path | None = None) -> None:
        """``run_dir``: where every check's last result goes after each step and each start check
        (``health.json``, :mod:`flowrl.checks.health_file`: the dashboard's health panel)."""
        unknown = sorted(set(modes) - set(CHECKS.names()) - set(START_CHECKS))
        if unknown:
            raise ValueError(f"unknown check {unknown[0]!r}; valid: {', '.join(sorted([*CHECKS.names(), *START_CHECKS]))}")
        for name, mode in modes.items():
            if mode not in MODES:
                raise ValueError(f"trainer.checks.{name}={mode!r}: not a mode; use one of {', '.join(MODES)}")
        self.start_modes = {name: modes.get(name, default) for name, default in START_CHECKS.items()}
        self.modes = {name: modes.get(name, CHECKS.traits(name)["default"]) for name in CHECKS.names()}
        self.limits = limits
        self.memory: dict[str, dict] = {name: {} for name in self.modes}
        self.last: dict[str, Verdict] = {}
        self.failed: list[tuple[str, int, Verdict]] = []  # error-mode failures of the last step
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.step = 0  # the last observed step (verl's numbering; 0: before the first)

    def observe(self, index: int, table: Any, metrics: Mapping[str, float]) -> dict[str, float]:
        """Run the enabled checks on step ``index`` (0-based): their metrics (``checks/<name>``
        1 when it failed, ``checks/<name>_value`` its number, ``checks/time_s``). A failure in
        ``warn`` mode is logged; one in ``error`` mode waits for :meth:`enforce`."""
        start = time.perf_counter()
        data = StepData(index, table, metrics)
        out: dict[str, float] = {}
        self.failed = []
        for name, mode in self.modes.items():
            if mode == "off" or table is None:  # None: a step without a table (nothing to check)
                continue
            verdict = self.last[name] = CHECKS.get(name)(data, self.limits, self.memory[name])
            if verdict.ok is None:
                continue
            out[PREFIX + name] = 0.0 if verdict.ok else 1.0
            if math.isfinite(verdict.value):
                out[f"{PREFIX}{name}_value"] = verdict.value
            if not verdict.ok and mode == "error":
                self.failed.append((name, index + 1, verdict))
            elif not verdict.ok:
                log.warning("check %s at step %d: %s", name, index + 1, verdict.message)
        self.step = index + 1
        self._write()
        out[TIME] = time.perf_counter() - start
        return out

    def record(self, name: str, verdict: Verdict) -> None:
        """The verdict of start check ``name``: on the health line; a failure logged (``warn``)
        or raised as :class:`CheckFailed` (``error``, at step 0: before the first step)."""
        mode = self.start_modes[name]
        if mode == "off":
            return
        self.last[name] = verdict
        self._write()
        if verdict.ok is False and mode == "error":
            raise CheckFailed(name, 0, verdict)
        if verdict.ok is False:
            log.warning("check %s at start: %s", name, verdict.message)

    def enforce(self) -> None:
        """Raise :class:`CheckFailed` for the first error-mode failure of the last step."""
        if self.failed:
            raise CheckFailed(*self.failed[0])

    def rewind(self) -> None:
        """The run goes back to a checkpoint: the last step's results go (the multi-step memories
        are the checkpoint's, :meth:`load_state_dict`, loaded by the run)."""
        self.last = {name: v for name, v in self.last.items() if name in self.start_modes}
        self.failed = []

    def state_dict(self) -> dict[str, dict]:
        """The checks' multi-step memories (a checkpoint's ``extra["checks"]``), so a resumed run
        counts on where the run stopped (``reward_signal``'s steps without signal)."""
        return {name: dict(memory) for name, memory in self.memory.items() if memory}

    def load_state_dict(self, state: Mapping[str, dict]) -> None:
        """Memories from :meth:`state_dict` (``{}``: every check starts again)."""
        self.memory = {name: dict(state.get(name, {})) for name in self.modes}

    def results(self) -> dict[str, dict[str, str]]:
        """Every check's last result, start checks first: name -> ``state`` (:data:`STATES`) and
        ``message`` (what diverged and the likely cause, or why it had nothing to check)."""
        out = {}
        for name, mode in {**self.start_modes, **self.modes}.items():
            verdict = self.last.get(name)
            if mode == "off":
                state, message = "off", ""
            elif verdict is None:
                state, message = "not run", ""
            elif verdict.ok is False:
                state, message = ("failed" if mode == "error" else "warn"), verdict.message
            else:
                state, message = ("n/a" if verdict.ok is None else "ok"), verdict.message
            out[name] = {"state": state, "message": message}
        return out

    def health_line(self) -> str:
        """``health: chat_template=n/a finite=ok ... tokens=ok``: every
        check's last result (``off``; ``WARN`` a failure in warn mode; ``FAIL`` one that stops)."""
        return "health: " + " ".join(f"{name}={WORDS[r['state']]}" for name, r in self.results().items())

    def _write(self) -> None:
        if self.run_dir is not None:
            from flowrl.checks.health_file import write_health

            write_health(self.run_dir, self.step, self.results())

"""What every check shares: its input (one finished step), its verdict, its modes, the error.

A check is a pure function ``fn(data: StepData, limits: Limits, memory: dict) -> Verdict`` of
the step's experience table (the table the update trained on) and its metrics; ``memory`` is
the check's own dict, kept across steps by :class:`~flowrl.checks.runner.StepChecks` (emptied
when the run rewinds), for checks that look at several steps. Checks register in
:data:`CHECKS` with their default mode (``trainer.checks.<name>``, ``flowrl.config.checks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from flowrl.registry import Registry

MODES = ("off", "warn", "error")
"""``trainer.checks.<name>``: ``off`` (not run), ``warn`` (logged, the run goes on), ``error``
(the run stops after logging the step, with the check's message)."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    """The run's bounds the checks compare against (from the config, ``flowrl.run.health``)."""

    max_lag: int
    """The largest weight-version lag a trained row may have."""
    lag_source: str
    """Where ``max_lag`` comes from, for messages (``trainer.staleness=1``)."""
    no_signal_steps: int
    """``trainer.checks.reward_signal_steps``: consecutive steps without a learning signal."""
    logprob_kl_max: float
    """``trainer.checks.logprob_kl_max``: the rollout/trainer mean per-token KL alarm."""


@dataclass(frozen=True)
class StepData:
    """One finished step: ``index`` is 0-based (the updates before it; logged as ``index + 1``),
    ``table`` the experience the update trained on, ``metrics`` the step's metrics."""

    index: int
    table: Any  # pa.Table
    metrics: Mapping[str, float]


@dataclass(frozen=True)
class Verdict:
    """A check's result for one step: ``ok`` (None: nothing to check in this step, e.g. a
    supervised family has no rewards), its number (logged as ``checks/<name>_value``) and a
    message that names what diverged and the likely cause."""

    ok: bool | None
    value: float
    message: str

    @property
    def word(self) -> str:
        return "n/a" if self.ok is None else ("ok" if self.ok else "FAIL")


def skipped(why: str) -> Verdict:
    return Verdict(None, float("nan"), why)


CheckFn = Callable[[StepData, Limits, dict], Verdict]

CHECKS: Registry[CheckFn] = Registry("check")
"""Name -> check function; trait ``default``: its mode unless ``trainer.checks.<name>`` says
otherwise (the config's defaults are held equal to these by the tests)."""


def register_check(name: str, *, default: str) -> Callable[[CheckFn], CheckFn]:
    assert default in MODES, default
    return CHECKS.register(name, default=default)  # type: ignore[return-value]


class CheckFailed(RuntimeError):
    """A check in ``error`` mode failed: the run stops after logging the step. The message
    names the check, the step, what diverged and the likely cause, and how to tune the check."""

    def __init__(self, name: str, step: int, verdict: Verdict) -> None:
        self.name, self.step, self.verdict = name, step, verdict
        super().__init__(f"check {name} failed at step {step}: {verdict.message} "
                         f"(trainer.checks.{name}=warn to log it and go on, =off to skip it)")


def flat(table: Any, name: str) -> tuple[Any, Any]:
    """A list column of ``table`` as (flat values, offsets from 0) numpy arrays, without torch."""
    import numpy as np

    column = table.column(name)
    arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    offsets = arr.offsets.to_numpy()
    start, stop = int(offsets[0]), int(offsets[-1])
    values = arr.values.slice(start, stop - start).to_numpy(zero_copy_only=False)
    return values, (offsets - start).astype(np.int64)


def first_row(table: Any, rows: Any) -> str:
    """``row 3 (uid ..., group 1)``: the first of ``rows`` (indices), for messages."""
    i = int(rows[0])
    parts = [f"{c} {table.column(c)[i].as_py()}" for c in ("uid", "group") if c in table.column_names]
    return f"row {i}" + (f" ({', '.join(parts)})" if parts else "")

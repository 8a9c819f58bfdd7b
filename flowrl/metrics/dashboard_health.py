"""The dashboard's health panel: every check's last result (issue 32 item 7), per run.

Read from the run directory: ``health.json`` (:mod:`flowrl.checks.health_file`, written by the
run's checks after each step: state and message of every check, the start checks included) while
it is of the last step ``metrics.jsonl`` holds; otherwise (a run that wrote none, or a file
behind the metrics) from the metrics alone: ``checks/<name>`` of the last step (1 failed, 0 ok,
absent: nothing to check) and the modes of ``config.yaml``'s ``trainer.checks`` (a failure in
``warn`` mode is ``warn``, in ``error`` mode ``failed``; ``off`` checks are ``off``), without messages.
Nothing here imports bokeh: :func:`health_html` is the panel's HTML (a ``Div``'s text).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from flowrl.checks.health_file import read_health

PREFIX = "checks/"
MODES = ("off", "warn", "error")
COLORS = {"ok": "#2ca02c", "warn": "#ff7f0e", "failed": "#d62728", "n/a": "#888", "off": "#888", "not run": "#888"}
"""A state's colour in the panel (the health line's words: ok, WARN, FAIL, n/a, off, -)."""
NO_CHECKS = "no check results yet"


@dataclass(frozen=True)
class Health:
    """One run's checks: ``rows`` (name, state, message) in the run's order, the step they are
    of (None: no step yet) and where they were read from (``health.json`` or ``metrics``)."""

    rows: list[tuple[str, str, str]]
    step: int | None
    source: str

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, state, _ in self.rows:
            out[state] = out.get(state, 0) + 1
        return out


def config_modes(config: dict) -> dict[str, str]:
    """``trainer.checks.<name>`` modes of a resolved ``config.yaml`` (YAML reads a bare ``off``
    as false); the section's numbers (``reward_signal_steps``, ...) are left out."""
    checks = (config.get("trainer") or {}).get("checks") or {}
    out = {}
    for name, mode in checks.items() if isinstance(checks, dict) else ():
        mode = "off" if mode is False else mode
        if mode in MODES:
            out[str(name)] = mode
    return out


def from_metrics(rows: dict[int, dict], modes: dict[str, str]) -> Health:
    """Each check's state in the last metrics row (``checks/<name>``), its mode from ``modes``."""
    names = sorted({k[len(PREFIX):] for row in rows.values() for k in row
                    if k.startswith(PREFIX) and not k.endswith("_value") and k != PREFIX + "time_s"})
    names += [n for n in modes if n not in names]
    if not rows:
        return Health([], None, "metrics")
    step = max(rows)
    last = rows[step]
    out = []
    for name in names:
        mode, value = modes.get(name), last.get(PREFIX + name)
        if mode == "off":
            state = "off"
        elif value is None or value != value:  # absent (or NaN): nothing checked in that step
            state = "n/a"
        elif value:
            state = "warn" if mode == "warn" else "failed"
        else:
            state = "ok"
        out.append((name, state, "see the run's log for the message" if state in ("warn", "failed") else ""))
    return Health(out, step, "metrics")


def run_health(reader: Any) -> Health:
    """A run's last check results (``reader``: a :class:`~flowrl.metrics.run_reader.RunReader`)."""
    metrics = reader.metrics
    saved = read_health(reader.run_dir)
    last = max(metrics) if metrics else None
    if saved is not None and (last is None or int(saved.get("step", 0)) >= last):
        rows = [(str(name), str(r.get("state", "?")), str(r.get("message", "")))
                for name, r in saved["checks"].items() if isinstance(r, dict)]
        return Health(rows, int(saved.get("step", 0)), "health.json")
    return from_metrics(metrics, config_modes(reader.config))


def _table(health: Health) -> str:
    cells = []
    for name, state, message in health.rows:
        color = COLORS.get(state, "#000")
        shown = html.escape(message)  # a failure's message in full; otherwise why it had nothing to check, faint
        shown = shown if state in ("warn", "failed") else f"<span style='color:#888'>{shown}</span>"
        cells.append(f"<tr data-check='{html.escape(name)}' data-state='{html.escape(state)}'>"
                     f"<td style='padding:1px 10px 1px 0'><code>{html.escape(name)}</code></td>"
                     f"<td style='padding:1px 10px 1px 0;color:{color};font-weight:bold'>{html.escape(state)}</td>"
                     f"<td style='padding:1px 0'>{shown}</td></tr>")
    return "<table style='border-collapse:collapse;font-size:13px'>" + "".join(cells) + "</table>"


def health_html(healths: list[Health], labels: list[str]) -> str:
    """The panel: per run (its label when there are several), a summary line and a row per check."""
    parts = []
    for health, label in zip(healths, labels):
        title = f"<b>{html.escape(label)}</b>: " if len(labels) > 1 else ""
        if not health.rows:
            parts.append(f"<div>{title}<i>{NO_CHECKS}</i></div>")
            continue
        counts = ", ".join(f"{n} {state}" for state, n in health.counts().items())
        where = "at start" if not health.step else f"after step {health.step}"
        parts.append(f"<div style='margin:4px 0'>{title}{counts} ({where}, from {health.source})</div>{_table(health)}")
    return "".join(parts)

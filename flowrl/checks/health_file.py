"""Every check's last result in the run directory (``health.json``), for the dashboard's health panel.

:class:`~flowrl.checks.runner.StepChecks` rewrites it after each step and each start check
(replaced whole: a reader never sees half a file)::

    {"step": 3, "checks": {"finite": {"state": "ok", "message": "..."},
                           "staleness": {"state": "failed", "message": "row 5 ... lag 3 > 1 ..."}}}

``step`` is the last checked step (verl's numbering, 0 before the first). The metrics
(``checks/<name>`` in ``metrics.jsonl``) say whether a check failed; this file adds the message
that names what diverged, and the start checks (``chat_template``, ``resume``), which have no metric.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

HEALTH_FILE = "health.json"


def write_health(run_dir: str | Path, step: int, results: Mapping[str, Mapping[str, str]]) -> None:
    """Replace ``run_dir/health.json`` with ``results`` (name -> state and message) after ``step``."""
    path = Path(run_dir) / HEALTH_FILE
    tmp = path.with_name(f".{HEALTH_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"step": step, "checks": {n: dict(r) for n, r in results.items()}}, default=str))
    os.replace(tmp, path)


def read_health(run_dir: str | Path) -> dict[str, Any] | None:
    """``health.json`` of ``run_dir`` (None: absent, unreadable, or not the shape written above)."""
    path = Path(run_dir) / HEALTH_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("checks"), dict):
        return None
    return data

"""What the built-in tasks share on disk: the record of a built task (``task.json``: the settings
it was built with and its warm-up figures) and the Parquet files of its prompts."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["TASK_FILE", "read_record", "write_parquet"]

TASK_FILE = "task.json"


def read_record(root: Path, key: dict) -> dict | None:
    """The record of the task built in ``root`` with the settings ``key``, or None when it is
    missing, unreadable, built with other settings, or has no model."""
    try:
        record = json.loads((root / TASK_FILE).read_text())
    except (OSError, ValueError):
        return None
    if record.get("key") != key or not (root / "model" / "config.json").exists():
        return None
    return record


def write_parquet(out: Path, rows: list[dict], name: str) -> None:
    """``rows`` (verl's prompt columns) as ``out/name``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), out / name)

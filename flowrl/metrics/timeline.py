"""Per-step node timeline: ``timeline.jsonl`` in the run directory, one row per (step, node).

Each graph node records its wall-clock start and end (``NodeOut.spans``, ``time.time()`` on the
worker that ran it; one host, or hosts kept in sync by NTP). The trainer stores them relative to
the moment the step's graph was submitted::

    {"step": 3, "node": "gen", "start": 0.012, "end": 1.204}

so ``start`` is how long the node waited after submission (for its inputs, a free worker, the
previous step's weight sync) and ``end - start`` is its own time (``timing_s/<node>``). A step's
weight sync finishes after the step's result; its row is written when the next step (or
``close``) collects it, so rows of one step may be spread over the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

TIMELINE_FILE = "timeline.jsonl"


def span_rows(step: int, origin: float, spans: Mapping[str, tuple[float, float]],
              skip: Iterable[str] = ()) -> list[dict]:
    """Rows for ``timeline.jsonl``: ``spans`` (node -> absolute (start, end)) relative to
    ``origin`` (the step's submission time), sorted by start; nodes in ``skip`` left out."""
    skipped = set(skip)
    rows = [
        {"step": int(step), "node": name, "start": round(start - origin, 6), "end": round(end - origin, 6)}
        for name, (start, end) in spans.items()
        if name not in skipped
    ]
    return sorted(rows, key=lambda r: (r["start"], r["node"]))


def append_rows(path: str | Path, rows: list[dict]) -> None:
    """Append rows (one JSON object per line) and flush; nothing is written for no rows."""
    if not rows:
        return
    with open(path, "a") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))


def parse_timeline(lines: Iterable[str]) -> list[dict]:
    """Rows from ``timeline.jsonl`` lines; blank lines, a line cut by a crash (or still being
    written) and rows missing a field are skipped. A later row for the same (step, node) replaces
    an earlier one (a resumed run repeats steps)."""
    rows: dict[tuple[int, str], dict] = {}
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict):
            continue
        try:
            key = (int(row["step"]), str(row["node"]))
            rows[key] = {"step": key[0], "node": key[1], "start": float(row["start"]), "end": float(row["end"])}
        except (KeyError, TypeError, ValueError):
            continue
    return sorted(rows.values(), key=lambda r: (r["step"], r["start"], r["node"]))


def read_timeline(path: str | Path) -> list[dict]:
    """:func:`parse_timeline` of a file; no file: no rows."""
    path = Path(path)
    if not path.is_file():
        return []
    return parse_timeline(path.read_text().splitlines())

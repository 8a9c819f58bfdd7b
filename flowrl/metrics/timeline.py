"""Per-step node timeline: ``timeline.jsonl`` in the run directory, one row per (step, node).

Each graph node records its wall-clock start and end (``NodeOut.spans``, ``time.time()`` on the
worker that ran it; one host, or hosts kept in sync by NTP). The trainer stores them relative to
the moment the step's graph was submitted::

    {"step": 3, "node": "gen", "start": 0.012, "end": 1.204, "origin": 1780000000.123}

so ``start`` is how long the node waited after submission (for its inputs, a free worker, the
previous step's weight sync) and ``end - start`` is its own time (``timing_s/<node>``).
``origin`` is the submission time itself (epoch seconds), which puts rows of different steps on
one clock: with ``trainer.staleness`` > 0 a step's generation ran before the step was submitted
(a negative ``start``), while the previous step trained, and the dashboard shows that overlap.
Rows written before ``origin`` was recorded read as ``origin`` None. A step's
weight sync finishes after the step's result; its row is written when the next step (or
``close``) collects it, so rows of one step may be spread over the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

TIMELINE_FILE = "timeline.jsonl"
#: Rows of another step overlapping a step's span by less than this are not shown with it.
OVERLAP_MIN_S = 1e-3


def span_rows(step: int, origin: float, spans: Mapping[str, tuple[float, float]],
              skip: Iterable[str] = ()) -> list[dict]:
    """Rows for ``timeline.jsonl``: ``spans`` (node -> absolute (start, end)) relative to
    ``origin`` (the step's submission time), sorted by start; nodes in ``skip`` left out."""
    skipped = set(skip)
    rows = [
        {"step": int(step), "node": name, "start": round(start - origin, 6), "end": round(end - origin, 6),
         "origin": round(origin, 6)}
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
            origin = row.get("origin")
            rows[key] = {"step": key[0], "node": key[1], "start": float(row["start"]), "end": float(row["end"]),
                         "origin": float(origin) if isinstance(origin, (int, float)) else None}
        except (KeyError, TypeError, ValueError):
            continue
    return sorted(rows.values(), key=lambda r: (r["step"], r["start"], r["node"]))


def overlapping_rows(rows: list[dict], step: int) -> list[dict]:
    """``step``'s rows, then the rows of later steps that ran while it ran (the generations
    ahead of a ``trainer.staleness`` run: gen(k+1) during update(k)), moved onto ``step``'s clock
    (seconds since ``step`` was submitted) and renamed ``"<node> (step N)"``. Needs ``origin``
    in the rows; without it only ``step``'s own rows. The page's step selector does the same in
    the browser (``PICK_STEP_JS``)."""
    own = [r for r in rows if r["step"] == step]
    origin = next((r["origin"] for r in own if r.get("origin") is not None), None)
    if not own or origin is None:
        return own
    lo, hi = min(r["start"] for r in own), max(r["end"] for r in own)
    others = []
    for r in rows:
        if r["step"] <= step or r.get("origin") is None:
            continue
        start, end = r["start"] + r["origin"] - origin, r["end"] + r["origin"] - origin
        if end > lo + OVERLAP_MIN_S and start < hi - OVERLAP_MIN_S:  # not rows that only touch (rounding)
            others.append({**r, "node": f"{r['node']} (step {r['step']})", "start": round(start, 6), "end": round(end, 6),
                           "origin": origin})
    return own + sorted(others, key=lambda r: (r["start"], r["node"]))


def read_timeline(path: str | Path) -> list[dict]:
    """:func:`parse_timeline` of a file; no file: no rows."""
    path = Path(path)
    if not path.is_file():
        return []
    return parse_timeline(path.read_text().splitlines())

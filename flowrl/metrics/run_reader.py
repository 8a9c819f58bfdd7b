"""Read a run directory while the run writes it: metrics, node timeline, experience samples.

The dashboard calls :meth:`RunReader.refresh` every few seconds. ``metrics.jsonl`` is read from
where the last refresh stopped (a half-written last line waits for the next refresh), and read
again from the start when it shrank (a resumed run rewrites it); ``timeline.jsonl`` is small and
read whole; a step's Parquet is read once it exists. Nothing here imports bokeh.

What is parsed is shared by every reader of the process (:class:`_Parsed`, thread-safe): a
server's sessions each have their readers, and a new session's first refresh takes the rows the
others parsed (checked against the file's bytes) and reads only what was written since; a
timeline or a step's Parquet is parsed once per file version (size and mtime).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from flowrl.data.images import collapse_image_tokens
from flowrl.metrics.run_dirs import (  # noqa: F401  (re-exported: the dashboard finds runs here)
    MAX_DIRS_SEARCHED, METRICS_FILE, RUN_DIR_HINT, find_runs, is_run_dir, run_labels, runs_below)
from flowrl.metrics.timeline import TIMELINE_FILE, read_timeline

log = logging.getLogger(__name__)

RUN_INFO_FILE = "run_info.json"
#: The samples table's columns, in display order.
SAMPLE_COLUMNS = ("step", "uid", "group", "data_source", "prompt", "response", "ground_truth", "score",
                  "response_length", "advantage", "num_turns", "tool_calls")
#: Per-sample data besides the shown columns: the response as turns (JSON ``[[kind, text], ...]``,
#: kind 1 the model's tokens, 0 a tool's answer), for the conversation view of a clicked row; and
#: how many rows the step's Parquet holds (the table keeps the first ``max_samples``).
SAMPLE_DATA_COLUMNS = SAMPLE_COLUMNS + ("turns", "step_rows", "images")
#: ``images``: a vision-language prompt's pictures as ``<img>`` thumbnails (HTML; empty for text).


@dataclass
class Changes:
    """What one :meth:`RunReader.refresh` found."""

    metrics_reset: bool = False  # metrics must be redrawn from scratch (a resume rewrote the file)
    new_metric_rows: list[dict] = field(default_factory=list)
    timeline_changed: bool = False
    new_sample_steps: list[int] = field(default_factory=list)

    @property
    def any(self) -> bool:
        return self.metrics_reset or bool(self.new_metric_rows) or self.timeline_changed or bool(self.new_sample_steps)

    @staticmethod
    def merged(found: list["Changes"]) -> "Changes":
        """What several runs' refreshes found, as one."""
        if len(found) == 1:
            return found[0]
        return Changes(metrics_reset=any(c.metrics_reset for c in found),
                       new_metric_rows=[row for c in found for row in c.new_metric_rows],
                       timeline_changed=any(c.timeline_changed for c in found),
                       new_sample_steps=sorted({s for c in found for s in c.new_sample_steps}))


class RunReader:
    """The files of one run directory, read incrementally.

    ``max_samples``: rows per step kept for the samples table (the first ones: GRPO groups are
    contiguous, so whole groups). ``decode``: decode token ids with the run's tokenizer
    (``model.path`` of ``config.yaml``); when it cannot be loaded the table shows the ids.
    """

    def __init__(self, run_dir: str | Path, *, max_samples: int = 64, decode: bool = True) -> None:
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise ValueError(f"run directory {self.run_dir} does not exist; fix: pass the trainer.run_dir of a run")
        if max_samples < 1:
            raise ValueError(f"max_samples={max_samples} must be >= 1; fix: use e.g. 64")
        self.max_samples = max_samples
        self.decode = decode
        self.metrics: dict[int, dict] = {}  # step -> row
        self.timeline: list[dict] = []
        self.samples: dict[int, dict[str, list]] = {}  # step -> columns
        self.tokenizer_note = ""  # why samples show token ids, if they do
        self._offset = 0
        self._partial = ""
        self._hash = hashlib.blake2b(digest_size=16)  # of the bytes read so far (what _PARSED checks)
        self._timeline_sig: tuple[int, int] | None = None
        self.dask_answers = False  # whether the recorded Dask dashboard answered (check_dask_dashboard)
        self._dask_checked: tuple[str | None, float] = (None, -math.inf)  # link, when

    # ----------------------------------------------------------------- static facts
    @property
    def config(self) -> dict:
        """The resolved ``config.yaml`` ({} while the run has not written it)."""
        import yaml

        path = self.run_dir / "config.yaml"
        try:
            data = yaml.safe_load(path.read_text()) if path.is_file() else {}
        except yaml.YAMLError:
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def run_info(self) -> dict:
        """``run_info.json`` (the Dask dashboard's address), {} if absent."""
        path = self.run_dir / RUN_INFO_FILE
        try:
            data = json.loads(path.read_text()) if path.is_file() else {}
        except json.JSONDecodeError:
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def dask_dashboard(self) -> str | None:
        """The Dask dashboard's address the run recorded (None: its cluster served none)."""
        link = self.run_info.get("dask_dashboard")
        return link if isinstance(link, str) and link else None

    def check_dask_dashboard(self, *, timeout_s: float = 1.0, every_s: float = 10.0) -> bool:
        """Whether the recorded Dask dashboard answers (its scheduler's ``/health``), asked at
        most every ``every_s`` (the last answer meanwhile) and kept in :attr:`dask_answers`: a
        finished run's cluster is gone, and a link to it is dead. Blocks up to ``timeout_s``:
        a live server asks from its worker thread."""
        link, now = self.dask_dashboard, time.monotonic()
        if link != self._dask_checked[0] or now - self._dask_checked[1] >= every_s:
            self.dask_answers = link is not None and _answers(link, timeout_s)
            self._dask_checked = (link, now)
        return self.dask_answers

    @property
    def training_steps(self) -> list[int]:
        """Steps of ``metrics.jsonl`` that trained: not a row of validation metrics alone (verl
        logs ``val_before_train`` at step 0, before training step 1; a run may count from 0 or 1)."""
        return sorted(s for s, row in self.metrics.items() if any(not is_validation_key(k) for k in row if k != "step"))

    # ----------------------------------------------------------------- reading
    def refresh(self) -> Changes:
        changes = Changes()
        self._read_metrics(changes)
        self._read_timeline(changes)
        self._read_samples(changes)
        return changes

    def _read_metrics(self, changes: Changes) -> None:
        path = self.run_dir / METRICS_FILE
        if not path.is_file():
            return
        size = path.stat().st_size
        if size < self._offset:  # rewritten (resume): start over
            self.metrics, self._offset, self._partial = {}, 0, ""
            self._hash = hashlib.blake2b(digest_size=16)
            changes.metrics_reset = True
        if size == self._offset:
            return
        if self._offset == 0 and _PARSED.adopt_metrics(self, path):
            changes.new_metric_rows.extend(self.metrics[s] for s in sorted(self.metrics))
            if size == self._offset:
                return
        with open(path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read(size - self._offset)
        self._offset = size
        self._hash.update(chunk)
        text = self._partial + chunk.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self._partial = lines.pop()  # "" after a complete last line
        for line in lines:
            row = _parse_metric_row(line)
            if row is None:
                continue
            if row["step"] in self.metrics:
                changes.metrics_reset = True  # a step written again: redraw
            self.metrics[row["step"]] = row
            changes.new_metric_rows.append(row)
        if lines and not self._partial:
            _PARSED.keep_metrics(path, self._offset, self._hash, self.metrics)

    def _read_timeline(self, changes: Changes) -> None:
        path = self.run_dir / TIMELINE_FILE
        if not path.is_file():
            return
        stat = path.stat()
        sig = (stat.st_size, stat.st_mtime_ns)
        if sig != self._timeline_sig:
            self._timeline_sig = sig
            self.timeline = _PARSED.get(str(path), sig, lambda: read_timeline(path))
            changes.timeline_changed = True

    def _read_samples(self, changes: Changes) -> None:
        folder = self.run_dir / "experience"
        if not folder.is_dir():
            return
        model: list[str | None] = []  # the tokenizer's model path, read once per refresh that needs it
        for path in sorted(folder.glob("step_*.parquet")):
            try:
                step = int(path.stem.split("_", 1)[1])
            except ValueError:
                continue
            if step in self.samples:
                continue
            if not model:
                model.append(str((self.config.get("model") or {}).get("path") or "") if self.decode else None)
            columns = self._load_samples(path, step, model[0])
            if columns is not None:
                self.samples[step] = columns
                changes.new_sample_steps.append(step)

    def _load_samples(self, path: Path, step: int, model: str | None) -> dict[str, list] | None:
        """A step's samples, parsed once per file version and tokenizer (``model``) in this process."""
        try:
            stat = path.stat()
        except OSError:
            return None
        version = (stat.st_size, stat.st_mtime_ns, self.max_samples, model)
        return _PARSED.get(str(path), version, lambda: self._parse_samples(path, step))

    def _parse_samples(self, path: Path, step: int) -> dict[str, list] | None:
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - still being written, or not Parquet: retry later
            log.debug("cannot read %s yet: %s", path, exc)
            return None
        return sample_columns(table.slice(0, self.max_samples), step, self._decoder(), step_rows=table.num_rows)

    def load_tokenizer(self) -> None:
        """Load the tokenizer the samples are decoded with now, not at the first refresh that
        finds a step's Parquet: importing transformers takes seconds, and the tokenizer is kept
        for every later reader of the same model (a server calls this before its first session)."""
        self._decoder()

    def _decoder(self) -> Any:
        if not self.decode:
            self.tokenizer_note = "token ids shown (decoding off)"
            return None
        model_path = (self.config.get("model") or {}).get("path") or ""
        tok, note = _load_tokenizer(str(model_path))
        self.tokenizer_note = note
        return tok

    # ----------------------------------------------------------------- views
    @property
    def metric_keys(self) -> list[str]:
        return sorted({k for row in self.metrics.values() for k in row if k != "step"})

    def metric_columns(self, keys: list[str] | None = None) -> dict[str, list[float]]:
        """``step`` plus one column per metric key (``keys``: these, e.g. the keys of every run
        on a page), NaN where a step lacks the key."""
        steps = sorted(self.metrics)
        keys = self.metric_keys if keys is None else keys
        return {"step": steps, **{k: [_num(self.metrics[s].get(k)) for s in steps] for k in keys}}

    def rows_columns(self, rows: list[dict], keys: list[str] | None = None) -> dict[str, list[float]]:
        """``rows`` (new metric rows) as columns over the current keys (or ``keys``), for a stream."""
        keys = self.metric_keys if keys is None else keys
        return {"step": [r["step"] for r in rows], **{k: [_num(r.get(k)) for r in rows] for k in keys}}

    @property
    def steps(self) -> list[int]:
        """Steps with a timeline or samples (what the step selector offers)."""
        return sorted({r["step"] for r in self.timeline} | set(self.samples))


class _Parsed:
    """What the readers of this process parsed, for the next reader of the same file: the rows
    of each ``metrics.jsonl`` up to a byte offset (with a hash of the bytes before it: a
    rewritten file is parsed again), and the parsed timeline or a step's samples of the latest
    version of a file (size, mtime) seen. Rows and columns are shared and never modified (a
    reader replaces a row, it does not change one). Hashing a file's bytes for a new reader
    costs a millisecond where parsing them costs a tenth of a second at 1,000 steps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, tuple[int, Any, dict[int, dict]]] = {}  # path -> offset, hash, rows
        self._files: dict[str, tuple[Any, Any]] = {}  # path -> version, parsed

    def keep_metrics(self, path: Path, offset: int, digest: Any, rows: dict[int, dict]) -> None:
        """Remember a reader's rows of ``path``, read up to ``offset`` (``digest``: the hash of those bytes)."""
        with self._lock:
            kept = self._metrics.get(str(path))
            if kept is None or kept[0] != offset:
                self._metrics[str(path)] = (offset, digest.copy(), dict(rows))

    def adopt_metrics(self, reader: "RunReader", path: Path) -> bool:
        """Give ``reader`` (nothing read yet) the rows parsed before, if the file still holds the
        bytes they came from."""
        with self._lock:
            kept = self._metrics.get(str(path))
        if kept is None or _digest(path, kept[0]) != kept[1].digest():
            return False
        offset, digest, rows = kept
        reader.metrics, reader._offset, reader._partial, reader._hash = dict(rows), offset, "", digest.copy()
        return True

    def get(self, path: str, version: Any, parse: Any) -> Any:
        """The value kept for ``version`` of ``path``, else ``parse()`` (kept, in place of an
        older version's, unless None). Two readers may parse the same file at once: same result."""
        with self._lock:
            kept = self._files.get(path)
        if kept is not None and kept[0] == version:
            return kept[1]
        value = parse()
        if value is not None:
            with self._lock:
                self._files[path] = (version, value)
        return value


_PARSED = _Parsed()


def _digest(path: Path, size: int) -> bytes | None:
    """A hash of the first ``size`` bytes of ``path`` (None: it has fewer, or cannot be read)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(size)
    except OSError:
        return None
    return hashlib.blake2b(data, digest_size=16).digest() if len(data) == size else None


def _parse_metric_row(line: str) -> dict | None:
    line = line.strip()
    if not line:
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(row, dict) or not isinstance(row.get("step"), int):
        return None
    return {k: v for k, v in row.items() if k == "step" or v is None or isinstance(v, (int, float))}


def is_validation_key(key: str) -> bool:
    """A validation metric (verl's ``val-core/...``, ``val-aux/...``; ``val/...``)."""
    return key.startswith(("val-", "val/"))


def _answers(link: str, timeout_s: float) -> bool:
    """Whether the Dask dashboard at ``link`` answers: its server's ``/health`` says ok."""
    import urllib.parse
    import urllib.request

    url = urllib.parse.urlsplit(link)
    try:
        with urllib.request.urlopen(f"{url.scheme}://{url.netloc}/health", timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, ValueError):  # refused, timed out, an HTTP error (404), a malformed link
        return False


def _num(v: Any) -> float:
    if v is None or isinstance(v, bool):
        return math.nan
    return float(v)


@lru_cache(maxsize=4)
def _load_tokenizer(model_path: str) -> tuple[Any, str]:
    if not model_path:
        return None, "token ids shown (config.yaml names no model.path)"
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_path), ""
    except Exception as exc:  # noqa: BLE001 - any failure: show ids, say why
        return None, f"token ids shown (cannot load the tokenizer of {model_path}: {type(exc).__name__})"


def sample_columns(table: Any, step: int, tokenizer: Any = None, *, step_rows: int | None = None) -> dict[str, list]:
    """The samples table's columns (:data:`SAMPLE_DATA_COLUMNS`) for an experience table: texts
    decoded with ``tokenizer`` (special tokens kept, so EOS shows), or the ids as text;
    ``step_rows``: the rows of the step's whole table (None: ``table``'s)."""
    n = table.num_rows
    names = set(table.column_names)

    def col(name: str, default: Any) -> list:
        return table.column(name).to_pylist() if name in names else [default] * n

    def text(ids_list: list) -> list[str]:
        ids_list = [ids or [] for ids in ids_list]
        if tokenizer is not None:
            return list(tokenizer.batch_decode(ids_list, skip_special_tokens=False))
        return [" ".join(map(str, ids)) for ids in ids_list]

    responses = col("response_ids", [])
    advantages = col("advantages", None)
    scores = col("score", None)
    spans = col("turn_spans", None)
    return {
        "step": [int(step)] * n,
        "uid": [str(u) for u in col("uid", "")],
        "group": [int(g) if g is not None else -1 for g in col("group", -1)],
        "data_source": [str(s) if s is not None else "" for s in col("data_source", "")],
        "prompt": [collapse_image_tokens(t) for t in text(col("prompt_ids", []))],
        "response": text(responses),
        "ground_truth": [str(s) if s is not None else "" for s in col("ground_truth", "")],
        "score": [_num(s) for s in scores],
        "response_length": [len(r or []) for r in responses],
        "advantage": [_num(a[0]) if a else math.nan for a in advantages],
        # a single-turn rollout is one model turn without tool calls
        "num_turns": [int(t) if t is not None else 1 for t in col("num_turns", None)],
        "tool_calls": [int(t) if t is not None else 0 for t in col("tool_calls", None)],
        "turns": [json.dumps(turn_texts(r or [], sp, text)) for r, sp in zip(responses, spans)],
        "step_rows": [n if step_rows is None else int(step_rows)] * n,
        "images": _thumbnails(col("images", None)),
    }


def _thumbnails(images: list) -> list[str]:
    """Each row's prompt images as thumbnails (``flowrl.data.images.thumbnail_html``); one per
    distinct picture (a GRPO group's rows share theirs)."""
    if not any(images):
        return [""] * len(images)
    from flowrl.data.images import thumbnail_html

    done: dict[tuple, str] = {}
    return [done.setdefault(tuple(row), thumbnail_html(row)) if row else "" for row in images]


def turn_texts(response_ids: list[int], spans: list | None, decode: Any) -> list[list]:
    """``[[kind, text], ...]``: the response cut at ``turn_spans`` (``[start, end, kind]`` per
    turn, kind 1 the model's tokens, 0 a tool's answer), each turn decoded with ``decode`` (a
    list of id lists -> a list of texts); no spans: the whole response as one model turn."""
    if not spans:
        return [[1, decode([response_ids])[0]]] if response_ids else []
    pieces = [response_ids[int(start):int(end)] for start, end, _ in spans]
    return [[int(kind), t] for (_, _, kind), t in zip(spans, decode(pieces))]

"""Experience as Arrow tables: one row per sample, token fields as ragged list columns.

No padding is stored: a token column's list offsets are the ``cu_seqlens`` of a packed batch.
Tables are never mutated; nodes return new tables with added columns.

Shape letters: B = rows (samples), T = all tokens of a column concatenated (sum of row lengths),
B1 = B + 1 offsets.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flowrl.data import file_modes

if TYPE_CHECKING:
    import torch

TOKEN_IDS = pa.list_(pa.int32())
TOKEN_FLOATS = pa.list_(pa.float32())

#: Declared columns and their types. Nodes add these as they go; user columns may be added too.
SCHEMA = pa.schema(
    [
        ("uid", pa.string()),  # unique per sample
        ("group", pa.int64()),  # one id per prompt, shared by its samples (verl's `index`/uid)
        ("data_source", pa.string()),
        ("ground_truth", pa.string()),
        ("prompt_ids", TOKEN_IDS),
        ("response_ids", TOKEN_IDS),
        ("response_mask", pa.list_(pa.int8())),
        ("rollout_logprobs", TOKEN_FLOATS),
        ("old_logprobs", TOKEN_FLOATS),
        ("ref_logprobs", TOKEN_FLOATS),
        ("values", TOKEN_FLOATS),
        ("token_rewards", TOKEN_FLOATS),
        ("advantages", TOKEN_FLOATS),
        ("returns", TOKEN_FLOATS),
        ("score", pa.float32()),
        # mixture-of-experts: per row, for each token of prompt then response, each MoE layer's
        # top_k experts ((P + R) * layers * top_k; -1 where generation did not compute the
        # position), recorded by the hf backend (flowrl.models.moe_routing, routing replay)
        ("routed_experts", pa.list_(pa.int16())),
    ]
)


def column_type(name: str) -> pa.DataType | None:
    idx = SCHEMA.get_field_index(name)
    return None if idx < 0 else SCHEMA.field(idx).type


def _list_array(table: pa.Table, name: str) -> pa.ListArray:
    if name not in table.column_names:
        raise KeyError(f"experience table has no column {name!r}; it has {table.column_names}")
    column = table.column(name)
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def token_column(table: pa.Table, name: str) -> tuple["torch.Tensor", "torch.Tensor"]:
    """A ragged token column as (flat values_T, cu_seqlens_B1), the values zero-copy.

    The values tensor shares memory with the Arrow buffer (read-only: do not write into it);
    ``cu_seqlens`` is rebased to start at 0 for sliced tables.
    """
    import torch

    arr = _list_array(table, name)
    if arr.null_count:
        raise ValueError(f"column {name!r} has {arr.null_count} null rows; every sample needs a value")
    offsets = arr.offsets.to_numpy()
    start, stop = int(offsets[0]), int(offsets[-1])
    values = arr.values.slice(start, stop - start)
    if len(values) == 0:
        flat = torch.empty(0, dtype=_torch_dtype(values.type))
    else:
        flat = torch.from_dlpack(values)  # zero-copy view of the Arrow buffer
    cu = torch.from_numpy((offsets - start).astype(np.int64))
    return flat, cu


def _torch_dtype(tp: pa.DataType) -> "torch.dtype":
    import torch

    return {
        pa.int8(): torch.int8,
        pa.int16(): torch.int16,
        pa.int32(): torch.int32,
        pa.int64(): torch.int64,
        pa.float32(): torch.float32,
    }[tp]


def list_column(
    values_T: "torch.Tensor | np.ndarray", cu_seqlens_B1: "torch.Tensor | np.ndarray", list_type: pa.ListType
) -> pa.ListArray:
    """(flat values, offsets) -> Arrow list array of ``list_type``, without copying the values."""
    value_type = list_type.value_type
    values = values_T.detach().cpu().numpy() if hasattr(values_T, "detach") else np.asarray(values_T)
    offsets = cu_seqlens_B1.cpu().numpy() if hasattr(cu_seqlens_B1, "cpu") else np.asarray(cu_seqlens_B1)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type))


def from_lists(rows: Sequence[Sequence[float]] | Sequence[Sequence[int]], list_type: pa.ListType) -> pa.ListArray:
    """Python/numpy per-row sequences -> Arrow list array of ``list_type``."""
    value_type = list_type.value_type
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([np.asarray(r) for r in rows]) if len(rows) and offsets[-1] else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.astype(value_type.to_pandas_dtype()), type=value_type))


def with_columns(table: pa.Table, **columns: pa.Array | pa.ChunkedArray) -> pa.Table:
    """A new table with columns added or replaced (the input is untouched)."""
    for name, array in columns.items():
        expected = column_type(name)
        if expected is not None and array.type != expected:
            array = array.cast(expected)
        if len(array) != table.num_rows:
            raise ValueError(f"column {name!r} has {len(array)} rows, the table {table.num_rows}")
        idx = table.schema.get_field_index(name)
        table = table.set_column(idx, name, array) if idx >= 0 else table.append_column(name, array)
    return table


def lengths(table: pa.Table, name: str) -> np.ndarray:
    """Per-row lengths of a list column."""
    return pc.list_value_length(table.column(name)).to_numpy(zero_copy_only=False)


def split(table: pa.Table, num_parts: int) -> list[pa.Table]:
    """Contiguous, nearly equal row slices (zero-copy); concatenating them gives the table back."""
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    bounds = np.linspace(0, table.num_rows, num_parts + 1).round().astype(int)
    return [table.slice(int(a), int(b - a)) for a, b in zip(bounds[:-1], bounds[1:])]


def concat(tables: Sequence[pa.Table]) -> pa.Table:
    """Concatenate tables with the same columns, in order; their :func:`with_stats` merged."""
    if not tables:
        raise ValueError("nothing to concatenate")
    merged: dict[str, float] = {}
    for t in tables:
        for k, v in table_stats(t).items():
            merged[k] = max(merged.get(k, v), v) if k.endswith("_gb") else merged.get(k, 0.0) + v
    out = pa.concat_tables([_without_stats(t) for t in tables], promote_options="none")
    return with_stats(out, merged) if merged else out


def _without_stats(table: pa.Table) -> pa.Table:
    meta = table.schema.metadata
    return table if not meta or _STATS_KEY not in meta else table.replace_schema_metadata(
        {k: v for k, v in meta.items() if k != _STATS_KEY} or None)


_STATS_KEY = b"flowrl.stats"


def with_stats(table: pa.Table, stats: dict[str, float]) -> pa.Table:
    """``table`` carrying ``stats`` (what a worker measured while making it, e.g. decode positions)
    in its schema metadata; :func:`concat` sums them over ranks (``*_gb``: the maximum)."""
    import json

    return table.replace_schema_metadata({**(table.schema.metadata or {}), _STATS_KEY: json.dumps(stats).encode()})


def pop_stats(table: pa.Table) -> tuple[pa.Table, dict[str, float]]:
    """``table`` without its :func:`with_stats`, and those stats."""
    return _without_stats(table), table_stats(table)


def table_stats(table: pa.Table) -> dict[str, float]:
    """The stats :func:`with_stats` attached to ``table`` (empty when none)."""
    import json

    raw = (table.schema.metadata or {}).get(_STATS_KEY)
    return json.loads(raw) if raw else {}


def write_parquet(table: pa.Table, path: str | Path) -> Path:
    """Write atomically (temp file + rename) so a crash never leaves a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, file_modes.file_mode())  # mkstemp makes it 0600 whatever the run's policy
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def step_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "experience" / f"step_{step:06d}.parquet"

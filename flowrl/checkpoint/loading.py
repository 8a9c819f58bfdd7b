"""Loading checkpoints: the meta of a complete save, full arrays, one rank's shard under any
layout, the newest complete checkpoint of a directory, and pruning old ones.

A checkpoint is complete when its ``meta.json`` exists (see ``zarr_store``); temporary and
moved-aside directories of crashed saves are never loaded.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from flowrl.checkpoint.format import (FIX, FORMAT, FORMAT_VERSION, LATEST, META, OLD_MARK, TMP_MARK,
                                      check_shapes, dim_index, from_storage, local_index,
                                      recover_replaced, remove, shard_key, storage_dtype)

if TYPE_CHECKING:
    from flowrl.parallel.shard_spec import RankShard, ShardSpec

__all__ = ["check_params", "checkpoint_damage", "latest_checkpoint", "load_full", "load_meta", "load_shard", "prune_checkpoints"]


def load_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``meta.json`` of a complete checkpoint; ValueError naming the file otherwise."""
    path = os.fspath(path)
    file = os.path.join(path, META)
    if not os.path.isdir(path):
        raise ValueError(f"checkpoint {path!r} does not exist or is not a directory; {FIX}")
    if TMP_MARK in os.path.basename(os.path.normpath(path)):
        raise ValueError(f"{path!r} is the temporary directory of a save that never committed (its "
                         f"writer died or failed before the final rename); it is never loaded; {FIX}")
    if not os.path.isfile(file):
        raise ValueError(f"{file} is missing: {path!r} is not a complete flowrl checkpoint (a save "
                         f"that never finished, or another tool's directory); {FIX}")
    try:
        with open(file, encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file} is corrupt ({err}); {FIX}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{file} is not a flowrl checkpoint's meta (format != {FORMAT!r}); {FIX}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{file}: format_version {meta.get('format_version')!r} is not "
                         f"{FORMAT_VERSION}; load it with the flowrl version that wrote it "
                         f"({meta.get('flowrl_version')}) or {FIX}")
    for field in ("step", "params", "optim"):
        if field not in meta:
            raise ValueError(f"{file} has no {field!r}; it is corrupt; {FIX}")
    if not isinstance(meta["step"], int) or meta["step"] < 0:
        raise ValueError(f"{file} has the step {meta['step']!r}, not a step number; it is corrupt; {FIX}")
    return meta


def check_params(path: str | os.PathLike, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """Check a checkpoint holds exactly parameters ``shapes`` (HF name -> shape); return its meta.
    ValueError naming ``meta.json`` and the first mismatches otherwise."""
    meta = load_meta(path)
    saved = {n: tuple(e["shape"]) for n, e in meta["params"].items()}
    check_shapes(os.path.join(os.fspath(path), META), saved, shapes, "the target model")
    return meta


def _table(meta: dict[str, Any], path: str, state: str | None) -> tuple[str, dict[str, Any]]:
    if state is None:
        return "params", meta["params"]
    if state not in meta["optim"]:
        raise ValueError(f"{os.path.join(path, META)}: no optimizer state {state!r}; saved states: "
                         f"{sorted(meta['optim']) or 'none'}")
    return f"optim/{state}", meta["optim"][state]


def load_full(path: str | os.PathLike, *, state: str | None = None,
              as_torch: bool = False) -> dict[str, Any]:
    """Every parameter (or optimizer state ``state``) as a full HF-named array."""
    import zarr

    path = os.fspath(path)
    prefix, table = _table(load_meta(path), path, state)
    group = zarr.open_group(path, mode="r")
    return {n: from_storage(group[f"{prefix}/{n}"][...], e["dtype"], as_torch)
            for n, e in table.items()}


def load_shard(path: str | os.PathLike, spec: ShardSpec, rank: int | tuple[int, ...] | RankShard,
               *, state: str | None = None, as_torch: bool = False) -> dict[str, Any]:
    """The local tensors of ``rank`` under target layout ``spec`` (padding zero), reading only
    the chunks its pieces overlap. ValueError if the checkpoint holds another model."""
    import zarr

    path = os.fspath(path)
    meta = check_params(path, spec.params)
    prefix, table = _table(meta, path, state)
    key, _ = shard_key(spec, rank)
    shard = spec.shards[key]
    logical = {p.local: table[p.param]["dtype"] for p in shard.pieces}
    fallback = next(iter(table.values()))["dtype"]
    out = {name: np.zeros(shape, dtype=storage_dtype(logical.get(name, fallback)))
           for name, shape in shard.tensors.items()}
    group = zarr.open_group(path, mode="r")
    arrays: dict[str, Any] = {}
    for p in shard.pieces:
        if p.param not in arrays:
            arrays[p.param] = group[f"{prefix}/{p.param}"]
        out[p.local][local_index(p, p.offset, p.offset + p.length)] = \
            arrays[p.param][dim_index(p.dim, p.start, p.stop)]
    return {n: from_storage(a, logical.get(n, fallback), as_torch) for n, a in out.items()}


def _complete(path: str) -> dict[str, Any] | None:
    try:
        return load_meta(path)
    except ValueError:
        return None


def _candidates(root: str) -> list[tuple[int, str]]:
    found = []
    for entry in os.listdir(root):
        full = os.path.join(root, entry)
        if TMP_MARK in entry or OLD_MARK in entry or not os.path.isdir(full):
            continue
        meta = _complete(full)
        if meta is not None:
            found.append((meta["step"], full))
    return sorted(found)


def latest_checkpoint(root: str | os.PathLike) -> str | None:
    """The newest complete checkpoint under ``root``: the one ``<root>/latest`` names if it is
    complete, else the complete one with the highest step; None if there is none."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        return None
    recover_replaced(root)
    try:
        with open(os.path.join(root, LATEST), encoding="utf-8") as fh:
            name = fh.read().strip()
        if name and os.sep not in name and _complete(os.path.join(root, name)) is not None:
            return os.path.join(root, name)
    except (OSError, UnicodeDecodeError):  # missing or garbled: the newest complete one (checkpoint_damage)
        pass
    found = _candidates(root)
    return found[-1][1] if found else None


def checkpoint_damage(root: str | os.PathLike) -> list[str]:
    """What is damaged under ``root`` (one line each), which :func:`latest_checkpoint` steps
    around: a ``latest`` pointer that is missing, empty, names a place outside ``root`` or a
    checkpoint that is not complete; a checkpoint directory without a loadable ``meta.json``.
    Temporary and moved-aside directories of crashed saves are no damage."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        return []
    problems = []
    entries = sorted(e for e in os.listdir(root)
                     if TMP_MARK not in e and OLD_MARK not in e and os.path.isdir(os.path.join(root, e)))
    for entry in entries:
        try:
            load_meta(os.path.join(root, entry))
        except ValueError as exc:
            problems.append(str(exc).replace(f"; {FIX}", "").replace(f" or {FIX}", ""))
    pointer = os.path.join(root, LATEST)
    try:
        with open(pointer, encoding="utf-8") as fh:
            name = fh.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        if entries:
            problems.append(f"{pointer} is unreadable ({exc.strerror if isinstance(exc, OSError) else exc})")
        return problems
    if not name:
        problems.append(f"{pointer} is empty")
    elif os.sep in name or name in (".", "..") or name not in entries:
        problems.append(f"{pointer} names {name!r}, which is not a checkpoint directory of {root}")
    return problems


def prune_checkpoints(root: str | os.PathLike, keep: int) -> list[str]:
    """Delete all but the ``keep`` newest complete checkpoints (``trainer.max_ckpt_to_keep``),
    never the one ``latest`` names; returns the deleted paths. ``keep`` <= 0 keeps all."""
    root = os.fspath(root)
    if keep <= 0 or not os.path.isdir(root):
        return []
    latest = latest_checkpoint(root)
    found = [p for _, p in _candidates(root)]
    doomed = [p for p in found[:-keep] if p != latest]
    for p in doomed:
        remove(p)
    return doomed

"""Layout-free checkpoints: one zarr array per Hugging Face parameter, loadable under any mesh.

On disk a checkpoint is a directory (zarr v3, one file per chunk)::

    <root>/step_00000010/
        zarr.json                                  root group
        meta.json                                  written last; its presence marks a complete save
        params/<hf name>/zarr.json                 full logical shape, dtype, chunk shape
        params/<hf name>/c/<i>/<j>                 one chunk (raw little-endian bytes + crc32c)
        optim/<state>/<hf name>/...                optimizer state, same shape and chunks
    <root>/latest                                  basename of the newest checkpoint

Chunks follow the saving mesh's shard boundaries (``chunk_plan``), so a rank of any other layout
reads only the chunks overlapping its pieces. Padding rows of a padded vocabulary are not stored;
they load as zeros. ``bfloat16`` is stored as ``uint16`` bit patterns (numpy has no bfloat16) and
comes back as bfloat16 with ``as_torch=True``.

``meta.json`` holds ``step``, the flowrl version, the saving layout (``null`` for a full-state
save), every parameter's shape / dtype / chunks, the optimizer states, ``rng`` (see ``rng.py``)
and ``extra``: whatever JSON the trainer adds (data-loader position, algorithm state such as the
adaptive KL coefficient, the resolved config).

Atomicity: a save writes into ``<path>.tmp-<uuid>``; the commit is ``meta.json`` (fsynced)
followed by ``os.replace`` to ``<path>`` and an atomic rewrite of ``<root>/latest``. A crash at
any point leaves either the previous state or the new one visible, never a half-written
checkpoint; leftover ``*.tmp-*`` directories are ignored by loaders and removed by the next save.
Chunk files are not fsynced (a kill -9 loses nothing; a power loss right after the rename can).

Sharded save (each rank writes only the chunks it owns, nobody needs the full tensor)::

    tmp = begin_checkpoint(path, spec, dtype="float32", optim_states=("exp_avg", "exp_avg_sq"))
    # rank 0 only; broadcast tmp, barrier
    write_shard(tmp, spec, rank, local_tensors, optim={"exp_avg": {...}, ...})   # every rank
    # barrier
    finalize_checkpoint(tmp, step=step, extra={...}, rng=...)                     # rank 0 only
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from flowrl._version import __version__
from flowrl.checkpoint.chunk_plan import (DEFAULT_MAX_CHUNK_BYTES, chunk_owners, chunk_shape,
                                          owned_runs, spec_chunks)

if TYPE_CHECKING:
    from flowrl.parallel.shard_spec import RankShard, ShardSpec

__all__ = [
    "begin_checkpoint", "check_params", "checkpoint_dir", "finalize_checkpoint", "latest_checkpoint",
    "load_full", "load_meta", "load_shard", "prune_checkpoints", "save_checkpoint", "write_shard",
]

FORMAT = "flowrl-checkpoint"
FORMAT_VERSION = 1
META = "meta.json"
PENDING = "pending.json"
LATEST = "latest"
TMP_MARK = ".tmp-"
OLD_MARK = ".old-"


# -- dtypes -----------------------------------------------------------------------------------

def _dtype_name(dtype: Any) -> str:
    """Logical dtype name of a torch / numpy dtype or a name (``"bfloat16"`` allowed)."""
    text = str(dtype)
    if text.startswith("torch."):
        return text.removeprefix("torch.")
    return "bfloat16" if text == "bfloat16" else np.dtype(dtype).name


def _storage(logical: str) -> str:
    return "uint16" if logical == "bfloat16" else logical


def _to_numpy(x: Any) -> tuple[np.ndarray, str]:
    """(array in its storage dtype, logical dtype name) of a numpy array or torch tensor."""
    if hasattr(x, "detach"):
        import torch

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
        a = t.numpy()
        return a, a.dtype.name
    a = np.asarray(x)
    return a, a.dtype.name


def _from_storage(a: np.ndarray, logical: str, as_torch: bool) -> Any:
    if not as_torch:
        return a
    import torch

    if logical == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# -- files ------------------------------------------------------------------------------------

def _write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _recover_replaced(root: str) -> None:
    """Put back a checkpoint moved aside (``<path>.old-<uuid>``) by a save that died before its
    replacement was renamed into ``<path>``."""
    for entry in os.listdir(root):
        original = os.path.join(root, entry.split(OLD_MARK)[0])
        full = os.path.join(root, entry)
        if OLD_MARK in entry and not os.path.exists(original) and \
                os.path.isfile(os.path.join(full, META)):
            os.replace(full, original)


def _clean_leftovers(root: str) -> None:
    """Remove temporary directories / files of crashed saves under ``root``."""
    if os.path.isdir(root):
        _recover_replaced(root)
        for entry in os.listdir(root):
            if TMP_MARK in entry or OLD_MARK in entry:
                _remove(os.path.join(root, entry))


def checkpoint_dir(root: str | os.PathLike, step: int) -> str:
    """The conventional directory of step ``step``'s checkpoint: ``<root>/step_00000010``."""
    return os.path.join(os.fspath(root), f"step_{step:08d}")


# -- saving -----------------------------------------------------------------------------------

def _entry(shape: tuple[int, ...], dtype: str, chunks: tuple[int, ...]) -> dict[str, Any]:
    return {"shape": list(shape), "dtype": dtype, "chunks": list(chunks)}


def _layout(spec: ShardSpec | None) -> dict[str, Any] | None:
    if spec is None:
        return None
    d = spec.dims
    return {"style": spec.style, "dp": d.dp, "tp": d.tp, "pp": d.pp, "vpp": d.vpp,
            "padded_vocab_size": spec.padded_vocab_size, "model": asdict(spec.model)}


def _begin(path: str, params: dict[str, dict[str, Any]],
           optim: dict[str, dict[str, dict[str, Any]]], layout: dict[str, Any] | None) -> str:
    import zarr
    from zarr.codecs import Crc32cCodec

    path = os.path.abspath(os.fspath(path))
    root = os.path.dirname(path)
    os.makedirs(root, exist_ok=True)
    _clean_leftovers(root)
    tmp = f"{path}{TMP_MARK}{uuid.uuid4().hex}"
    group = zarr.open_group(tmp, mode="w")
    arrays = [(f"params/{n}", e) for n, e in params.items()]
    arrays += [(f"optim/{s}/{n}", e) for s, table in optim.items() for n, e in table.items()]
    for name, e in arrays:
        group.create_array(name=name, shape=tuple(e["shape"]), chunks=tuple(e["chunks"]),
                           dtype=_storage(e["dtype"]), compressors=[Crc32cCodec()], fill_value=0,
                           config={"write_empty_chunks": True})
    _write_json(os.path.join(tmp, PENDING),
                {"path": path, "layout": layout, "params": params, "optim": optim})
    return tmp


def begin_checkpoint(path: str | os.PathLike, spec: ShardSpec, *, dtype: Any = "float32",
                     optim_states: tuple[str, ...] | Mapping[str, Any] = (),
                     max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES) -> str:
    """Rank 0 of a sharded save: create every array (no data) in a fresh temporary directory next
    to ``path`` and return it; broadcast it to the other ranks before they call ``write_shard``.

    ``dtype``: the parameters' dtype (torch/numpy dtype or name; a dict per HF name allowed).
    ``optim_states``: names of per-parameter optimizer states (``exp_avg``, ``exp_avg_sq``), or a
    dict state -> dtype; their arrays take the parameters' shapes and chunks."""
    dtypes = {n: _dtype_name(dtype[n] if isinstance(dtype, Mapping) else dtype)
              for n in spec.params}
    itemsizes = {n: np.dtype(_storage(d)).itemsize for n, d in dtypes.items()}
    chunks = spec_chunks(spec, itemsizes, max_chunk_bytes)
    params = {n: _entry(s, dtypes[n], chunks[n]) for n, s in spec.params.items()}
    states = optim_states if isinstance(optim_states, Mapping) else \
        {s: "float32" for s in optim_states}
    optim = {s: {n: _entry(e["shape"], _dtype_name(d), tuple(e["chunks"]))
                 for n, e in params.items()} for s, d in states.items()}
    return _begin(os.fspath(path), params, optim, _layout(spec))


def _read_pending(tmp: str) -> dict[str, Any]:
    file = os.path.join(tmp, PENDING)
    if not os.path.isfile(file):
        raise ValueError(f"{file} is missing: {tmp!r} is not a directory made by "
                         "begin_checkpoint (or it was already finalized); pass the path it returned")
    with open(file, encoding="utf-8") as fh:
        return json.load(fh)


def _shard_key(spec: ShardSpec, rank: int | tuple[int, int] | RankShard) -> tuple[tuple[int, int],
                                                                                    bool]:
    """(shard key, whether this rank is a dp replica other than dp_rank 0)."""
    if isinstance(rank, tuple):
        return rank, False
    if hasattr(rank, "tp_rank"):
        return (rank.tp_rank, rank.pp_rank), False
    dp_rank, tp_rank, pp_rank = spec.dims.rank_coords(rank)
    return (tp_rank, pp_rank), dp_rank != 0


def _writable(group: Any, name: str) -> Any:
    """Array ``name`` writing every chunk, all-zero ones included (zarr skips those by default and
    ``finalize_checkpoint`` checks that every chunk file exists)."""
    return group[name].with_config({"write_empty_chunks": True})


def _dim_index(dim: int, lo: int, hi: int) -> tuple[slice, ...]:
    return (slice(None),) * dim + (slice(lo, hi),)


def _write_locals(group: Any, prefix: str, spec: ShardSpec, key: tuple[int, int],
                  local_tensors: Mapping[str, Any], table: dict[str, dict[str, Any]],
                  owners: dict[str, list[tuple[int, int]]], what: str) -> None:
    shard = spec.shards[key]
    local_np: dict[str, np.ndarray] = {}
    local_dtype: dict[str, str] = {}
    for name, shape in shard.tensors.items():
        if name not in local_tensors:
            raise ValueError(f"write_shard: {what} has no local tensor {name!r} of shard "
                             f"(tp_rank, pp_rank)={key}; pass every tensor of spec.shards[{key}]")
        a, logical = _to_numpy(local_tensors[name])
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"write_shard: {what} tensor {name!r} has shape {tuple(a.shape)}, "
                             f"the shard spec says {tuple(shape)}; save with the spec the engine "
                             "was built with")
        local_np[name], local_dtype[name] = a, logical
    arrays: dict[str, Any] = {}
    for piece in shard.pieces:
        entry = table[piece.param]
        if local_dtype[piece.local] != entry["dtype"]:
            raise ValueError(f"write_shard: {what} tensor {piece.local!r} is "
                             f"{local_dtype[piece.local]}, the checkpoint declares "
                             f"{entry['dtype']} for {piece.param}; pass dtype= to begin_checkpoint")
        if piece.param not in arrays:
            arrays[piece.param] = _writable(group, f"{prefix}/{piece.param}")
        size, n = entry["chunks"][piece.dim], entry["shape"][piece.dim]
        src = local_np[piece.local]
        for lo, hi in owned_runs(owners[piece.param], size, n, piece.start, piece.stop, key):
            off = piece.offset - piece.start
            arrays[piece.param][_dim_index(piece.dim, lo, hi)] = \
                src[_dim_index(piece.dim, lo + off, hi + off)]


def write_shard(tmp: str, spec: ShardSpec, rank: int | tuple[int, int] | RankShard,
                local_tensors: Mapping[str, Any], *,
                optim: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Write one rank's shard into the arrays ``begin_checkpoint`` made in ``tmp``.

    ``rank``: a global rank (dp replicas other than dp_rank 0 write nothing), a ``(tp_rank,
    pp_rank)`` key or a ``RankShard``. ``local_tensors``: local name -> tensor exactly as
    ``spec.shards[key].tensors`` (megatron names, padded vocab). ``optim``: state -> local tensors
    of the same layout. Only the chunks this shard owns (``chunk_plan.chunk_owners``) are written,
    so ranks can write in parallel."""
    import zarr

    key, replica = _shard_key(spec, rank)
    if replica:
        return
    pending = _read_pending(tmp)
    params = pending["params"]
    _check_shapes(tmp, {n: tuple(e["shape"]) for n, e in params.items()}, spec.params,
                  "begin_checkpoint's spec")
    chunks = {n: tuple(e["chunks"]) for n, e in params.items()}
    owners = chunk_owners(spec, chunks)
    group = zarr.open_group(tmp, mode="r+")
    _write_locals(group, "params", spec, key, local_tensors, params, owners, "params")
    for state, tensors in (optim or {}).items():
        if state not in pending["optim"]:
            raise ValueError(f"write_shard: optimizer state {state!r} was not declared; pass it "
                             f"in begin_checkpoint(optim_states=...) (declared: "
                             f"{sorted(pending['optim'])})")
        _write_locals(group, f"optim/{state}", spec, key, tensors, pending["optim"][state],
                      owners, f"optim[{state!r}]")


def finalize_checkpoint(tmp: str, *, step: int, extra: Mapping[str, Any] | None = None,
                        rng: Any = None, update_latest: bool = True) -> str:
    """Rank 0, after every rank's ``write_shard``: check every chunk was written, write
    ``meta.json``, rename ``tmp`` to its final path (replacing an older save of that path) and
    point ``<root>/latest`` at it. Returns the final path."""
    import zarr

    pending = _read_pending(tmp)
    group = zarr.open_group(tmp, mode="r")
    names = [f"params/{n}" for n in pending["params"]]
    names += [f"optim/{s}/{n}" for s, t in pending["optim"].items() for n in t]
    for name in names:
        arr = group[name]
        if arr.nchunks_initialized != arr.nchunks:
            raise RuntimeError(f"checkpoint {tmp}: {name} has {arr.nchunks_initialized} of "
                               f"{arr.nchunks} chunks written; some rank did not call write_shard "
                               "(or wrote to another directory); not finalizing")
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "flowrl_version": __version__,
            "step": int(step), "layout": pending["layout"], "params": pending["params"],
            "optim": pending["optim"], "rng": rng, "extra": dict(extra or {})}
    _write_json(os.path.join(tmp, META), meta)
    os.unlink(os.path.join(tmp, PENDING))
    _fsync_dir(tmp)
    path = pending["path"]
    old = None
    if os.path.exists(path):
        old = f"{path}{OLD_MARK}{uuid.uuid4().hex}"
        os.replace(path, old)
    os.replace(tmp, path)
    root = os.path.dirname(path)
    _fsync_dir(root)
    if update_latest:
        pointer = os.path.join(root, f"{LATEST}{TMP_MARK}{uuid.uuid4().hex}")
        with open(pointer, "w", encoding="utf-8") as fh:
            fh.write(os.path.basename(path) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(pointer, os.path.join(root, LATEST))
        _fsync_dir(root)
    if old is not None:
        _remove(old)
    return path


def save_checkpoint(path: str | os.PathLike, *, step: int, params: Mapping[str, Any],
                    optim: Mapping[str, Mapping[str, Any]] | None = None,
                    extra: Mapping[str, Any] | None = None, rng: Any = None,
                    spec: ShardSpec | None = None,
                    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES) -> str:
    """Save full tensors (numpy or torch, HF names) from one process, atomically.

    ``optim``: state -> {HF name: full tensor}. ``spec``: chunk like this layout's shards (so a
    later load at that layout reads whole chunks); default: one chunk per tensor up to
    ``max_chunk_bytes``. ``rng``: e.g. ``rng.get_rng_state()``. Returns the final path. On an
    exception nothing becomes visible and the temporary directory is removed."""
    arrays = {n: _to_numpy(t) for n, t in params.items()}
    shapes = {n: tuple(a.shape) for n, (a, _) in arrays.items()}
    if spec is not None:
        _check_shapes("save_checkpoint(params=...)", shapes, spec.params, "the spec")
        chunks = spec_chunks(spec, {n: a.itemsize for n, (a, _) in arrays.items()},
                             max_chunk_bytes)
    else:
        chunks = {n: chunk_shape(s, 0, set(), arrays[n][0].itemsize, max_chunk_bytes)
                  for n, s in shapes.items()}
    table = {n: _entry(shapes[n], logical, chunks[n]) for n, (_, logical) in arrays.items()}
    optim_np = {s: {n: _to_numpy(t) for n, t in ts.items()} for s, ts in (optim or {}).items()}
    optim_table = {}
    for state, ts in optim_np.items():
        optim_table[state] = {}
        for n, (a, logical) in ts.items():
            c = chunks[n] if n in chunks and shapes[n] == a.shape else \
                chunk_shape(a.shape, 0, set(), a.itemsize, max_chunk_bytes)
            optim_table[state][n] = _entry(a.shape, logical, c)
    tmp = _begin(os.fspath(path), table, optim_table, _layout(spec))
    try:
        import zarr

        group = zarr.open_group(tmp, mode="r+")
        for n, (a, _) in arrays.items():
            _writable(group, f"params/{n}")[...] = a
        for state, ts in optim_np.items():
            for n, (a, _) in ts.items():
                _writable(group, f"optim/{state}/{n}")[...] = a
        return finalize_checkpoint(tmp, step=step, extra=extra, rng=rng)
    except BaseException:
        _remove(tmp)
        raise


# -- loading ----------------------------------------------------------------------------------

_FIX = ("point resume at a complete checkpoint (latest_checkpoint(root) skips broken ones) or start "
        "fresh with trainer.resume_mode=disable")


def load_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``meta.json`` of a complete checkpoint; ValueError naming the file otherwise."""
    path = os.fspath(path)
    file = os.path.join(path, META)
    if not os.path.isdir(path):
        raise ValueError(f"checkpoint {path!r} does not exist or is not a directory; {_FIX}")
    if TMP_MARK in os.path.basename(os.path.normpath(path)):
        raise ValueError(f"{path!r} is the temporary directory of a save that never committed (its "
                         f"writer died or failed before the final rename); it is never loaded; {_FIX}")
    if not os.path.isfile(file):
        raise ValueError(f"{file} is missing: {path!r} is not a complete flowrl checkpoint (a save "
                         f"that never finished, or another tool's directory); {_FIX}")
    try:
        with open(file, encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file} is corrupt ({err}); {_FIX}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{file} is not a flowrl checkpoint's meta (format != {FORMAT!r}); {_FIX}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{file}: format_version {meta.get('format_version')!r} is not "
                         f"{FORMAT_VERSION}; load it with the flowrl version that wrote it "
                         f"({meta.get('flowrl_version')}) or {_FIX}")
    for field in ("step", "params", "optim"):
        if field not in meta:
            raise ValueError(f"{file} has no {field!r}; it is corrupt; {_FIX}")
    return meta


def _check_shapes(where: str, saved: Mapping[str, tuple[int, ...]],
                  expected: Mapping[str, tuple[int, ...]], target: str) -> None:
    problems = [f"{n} is missing" for n in expected if n not in saved]
    problems += [f"{n} is not in {target}" for n in saved if n not in expected]
    problems += [f"{n} has shape {tuple(saved[n])}, {target} expects {tuple(expected[n])}"
                 for n in expected if n in saved and tuple(saved[n]) != tuple(expected[n])]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ValueError(f"{where} holds a different model than {target}: "
                         f"{'; '.join(problems[:3])}{more}; {_FIX}")


def check_params(path: str | os.PathLike, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """Check a checkpoint holds exactly parameters ``shapes`` (HF name -> shape); return its meta.
    ValueError naming ``meta.json`` and the first mismatches otherwise."""
    meta = load_meta(path)
    saved = {n: tuple(e["shape"]) for n, e in meta["params"].items()}
    _check_shapes(os.path.join(os.fspath(path), META), saved, shapes, "the target model")
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
    return {n: _from_storage(group[f"{prefix}/{n}"][...], e["dtype"], as_torch)
            for n, e in table.items()}


def load_shard(path: str | os.PathLike, spec: ShardSpec, rank: int | tuple[int, int] | RankShard,
               *, state: str | None = None, as_torch: bool = False) -> dict[str, Any]:
    """The local tensors of ``rank`` under target layout ``spec`` (padding zero), reading only
    the chunks its pieces overlap. ValueError if the checkpoint holds another model."""
    import zarr

    path = os.fspath(path)
    meta = check_params(path, spec.params)
    prefix, table = _table(meta, path, state)
    key, _ = _shard_key(spec, rank)
    shard = spec.shards[key]
    logical = {p.local: table[p.param]["dtype"] for p in shard.pieces}
    fallback = next(iter(table.values()))["dtype"]
    out = {name: np.zeros(shape, dtype=_storage(logical.get(name, fallback)))
           for name, shape in shard.tensors.items()}
    group = zarr.open_group(path, mode="r")
    arrays: dict[str, Any] = {}
    for p in shard.pieces:
        if p.param not in arrays:
            arrays[p.param] = group[f"{prefix}/{p.param}"]
        out[p.local][_dim_index(p.dim, p.offset, p.offset + p.length)] = \
            arrays[p.param][_dim_index(p.dim, p.start, p.stop)]
    return {n: _from_storage(a, logical.get(n, fallback), as_torch) for n, a in out.items()}


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
            found.append((int(meta["step"]), full))
    return sorted(found)


def latest_checkpoint(root: str | os.PathLike) -> str | None:
    """The newest complete checkpoint under ``root``: the one ``<root>/latest`` names if it is
    complete, else the complete one with the highest step; None if there is none."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        return None
    _recover_replaced(root)
    try:
        with open(os.path.join(root, LATEST), encoding="utf-8") as fh:
            name = fh.read().strip()
        if name and os.sep not in name and _complete(os.path.join(root, name)) is not None:
            return os.path.join(root, name)
    except OSError:
        pass
    found = _candidates(root)
    return found[-1][1] if found else None


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
        _remove(p)
    return doomed

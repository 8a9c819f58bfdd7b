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
import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from flowrl._version import __version__
from flowrl.checkpoint.chunk_plan import (DEFAULT_MAX_CHUNK_BYTES, chunk_owners, chunk_shape,
                                          owned_runs, spec_chunks)
from flowrl.checkpoint.format import (FORMAT, FORMAT_VERSION, LATEST, META, OLD_MARK, PENDING, TMP_MARK,
                                      check_shapes, clean_leftovers, dim_index, dtype_name, fsync_dir,
                                      local_index, remove, shard_key, storage_dtype, to_numpy,
                                      write_json)

if TYPE_CHECKING:
    from flowrl.parallel.shard_spec import RankShard, ShardSpec

__all__ = ["begin_checkpoint", "declared_chunks", "finalize_checkpoint", "save_checkpoint", "write_chunks",
           "write_shard"]


# -- saving -----------------------------------------------------------------------------------

def _entry(shape: tuple[int, ...], dtype: str, chunks: tuple[int, ...]) -> dict[str, Any]:
    return {"shape": list(shape), "dtype": dtype, "chunks": list(chunks)}


def _layout(spec: ShardSpec | None) -> dict[str, Any] | None:
    if spec is None:
        return None
    d = spec.dims
    return {"style": spec.style, "dp": d.dp, "tp": d.tp, "pp": d.pp, "vpp": d.vpp, "ep": d.ep,
            "etp": d.expert_tp, "padded_vocab_size": spec.padded_vocab_size,
            "model": asdict(spec.model)}


def _begin(path: str, params: dict[str, dict[str, Any]],
           optim: dict[str, dict[str, dict[str, Any]]], layout: dict[str, Any] | None) -> str:
    import zarr
    from zarr.codecs import Crc32cCodec

    path = os.path.abspath(os.fspath(path))
    root = os.path.dirname(path)
    os.makedirs(root, exist_ok=True)
    clean_leftovers(root)
    tmp = f"{path}{TMP_MARK}{uuid.uuid4().hex}"
    group = zarr.open_group(tmp, mode="w")
    arrays = [(f"params/{n}", e) for n, e in params.items()]
    arrays += [(f"optim/{s}/{n}", e) for s, table in optim.items() for n, e in table.items()]
    for name, e in arrays:
        group.create_array(name=name, shape=tuple(e["shape"]), chunks=tuple(e["chunks"]),
                           dtype=storage_dtype(e["dtype"]), compressors=[Crc32cCodec()], fill_value=0,
                           config={"write_empty_chunks": True})
    write_json(os.path.join(tmp, PENDING),
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
    dtypes = {n: dtype_name(dtype[n] if isinstance(dtype, Mapping) else dtype)
              for n in spec.params}
    itemsizes = {n: np.dtype(storage_dtype(d)).itemsize for n, d in dtypes.items()}
    chunks = spec_chunks(spec, itemsizes, max_chunk_bytes)
    params = {n: _entry(s, dtypes[n], chunks[n]) for n, s in spec.params.items()}
    states = optim_states if isinstance(optim_states, Mapping) else \
        {s: "float32" for s in optim_states}
    optim = {s: {n: _entry(e["shape"], dtype_name(d), tuple(e["chunks"]))
                 for n, e in params.items()} for s, d in states.items()}
    return _begin(os.fspath(path), params, optim, _layout(spec))


def _read_pending(tmp: str) -> dict[str, Any]:
    file = os.path.join(tmp, PENDING)
    if not os.path.isfile(file):
        raise ValueError(f"{file} is missing: {tmp!r} is not a directory made by "
                         "begin_checkpoint (or it was already finalized); pass the path it returned")
    with open(file, encoding="utf-8") as fh:
        return json.load(fh)


def _writable(group: Any, name: str) -> Any:
    """Array ``name`` writing every chunk, all-zero ones included (zarr skips those by default and
    ``finalize_checkpoint`` checks that every chunk file exists)."""
    return group[name].with_config({"write_empty_chunks": True})


def _write_locals(group: Any, prefix: str, spec: ShardSpec, key: tuple[int, ...],
                  local_tensors: Mapping[str, Any], table: dict[str, dict[str, Any]],
                  owners: dict[str, list[tuple[int, ...]]], what: str) -> None:
    shard = spec.shards[key]
    local_np: dict[str, np.ndarray] = {}
    local_dtype: dict[str, str] = {}
    for name, shape in shard.tensors.items():
        if name not in local_tensors:
            raise ValueError(f"write_shard: {what} has no local tensor {name!r} of shard "
                             f"key {key}; pass every tensor of spec.shards[{key}]")
        a, logical = to_numpy(local_tensors[name])
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
            arrays[piece.param][dim_index(piece.dim, lo, hi)] = \
                src[local_index(piece, lo + off, hi + off)]


def write_shard(tmp: str, spec: ShardSpec, rank: int | tuple[int, ...] | RankShard,
                local_tensors: Mapping[str, Any], *,
                optim: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Write one rank's shard into the arrays ``begin_checkpoint`` made in ``tmp``.

    ``rank``: a global rank (replicas of its shard key other than the first write nothing), a
    shard key (``(tp_rank, pp_rank)``, with ``(ep_rank, etp_rank)`` under expert parallelism:
    ``spec.key_of(rank)``) or a ``RankShard``. ``local_tensors``: local name -> tensor exactly as
    ``spec.shards[key].tensors`` (megatron names, padded vocab). ``optim``: state -> local tensors
    of the same layout. Only the chunks this shard owns (``chunk_plan.chunk_owners``) are written,
    so ranks can write in parallel."""
    import zarr

    key, replica = shard_key(spec, rank)
    if replica:
        return
    pending = _read_pending(tmp)
    params = pending["params"]
    check_shapes(tmp, {n: tuple(e["shape"]) for n, e in params.items()}, spec.params,
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


def declared_chunks(tmp: str) -> dict[str, tuple[int, ...]]:
    """The chunk shape of every parameter (and of its optimizer states) ``begin_checkpoint``
    declared in ``tmp``: what writers of single chunks (``write_chunks``) align with."""
    return {n: tuple(e["chunks"]) for n, e in _read_pending(tmp)["params"].items()}


def write_chunks(tmp: str, writes: Any) -> None:
    """Write whole chunks into the arrays of ``tmp``: ``writes`` yields ``(state, param, region,
    array)``, ``state`` None for the parameter itself, ``region`` one ``(lo, hi)`` per dim. A region
    must be a union of whole chunks (a partial chunk is a read-modify-write that races with the
    chunk's other writers): ValueError otherwise. For writers that own chunks, not shards (megatron's
    distributed optimizer: a dp rank's flat ranges)."""
    import zarr

    pending = _read_pending(tmp)
    group = zarr.open_group(tmp, mode="r+")
    arrays: dict[str, Any] = {}
    for state, param, region, value in writes:
        table = pending["params"] if state is None else pending["optim"].get(state)
        if table is None or param not in table:
            raise ValueError(f"write_chunks: {'params' if state is None else state}/{param} was not declared "
                             "by begin_checkpoint; declare it there")
        entry = table[param]
        for (lo, hi), n, c in zip(region, entry["shape"], entry["chunks"]):
            if lo % c or (hi % c and hi != n):
                raise ValueError(f"write_chunks: region {region} of {param} is not whole chunks of "
                                 f"{tuple(entry['chunks'])}; write whole chunks only")
        a, logical = to_numpy(value)
        if logical != entry["dtype"]:
            raise ValueError(f"write_chunks: {param} is {logical}, the checkpoint declares {entry['dtype']}")
        name = f"params/{param}" if state is None else f"optim/{state}/{param}"
        if name not in arrays:
            arrays[name] = _writable(group, name)
        arrays[name][tuple(slice(lo, hi) for lo, hi in region)] = a


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
    write_json(os.path.join(tmp, META), meta)
    os.unlink(os.path.join(tmp, PENDING))
    fsync_dir(tmp)
    path = pending["path"]
    old = None
    if os.path.exists(path):
        old = f"{path}{OLD_MARK}{uuid.uuid4().hex}"
        os.replace(path, old)
    os.replace(tmp, path)
    root = os.path.dirname(path)
    fsync_dir(root)
    if update_latest:
        pointer = os.path.join(root, f"{LATEST}{TMP_MARK}{uuid.uuid4().hex}")
        with open(pointer, "w", encoding="utf-8") as fh:
            fh.write(os.path.basename(path) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(pointer, os.path.join(root, LATEST))
        fsync_dir(root)
    if old is not None:
        remove(old)
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
    arrays = {n: to_numpy(t) for n, t in params.items()}
    shapes = {n: tuple(a.shape) for n, (a, _) in arrays.items()}
    if spec is not None:
        check_shapes("save_checkpoint(params=...)", shapes, spec.params, "the spec")
        chunks = spec_chunks(spec, {n: a.itemsize for n, (a, _) in arrays.items()},
                             max_chunk_bytes)
    else:
        chunks = {n: chunk_shape(s, 0, set(), arrays[n][0].itemsize, max_chunk_bytes)
                  for n, s in shapes.items()}
    table = {n: _entry(shapes[n], logical, chunks[n]) for n, (_, logical) in arrays.items()}
    optim_np = {s: {n: to_numpy(t) for n, t in ts.items()} for s, ts in (optim or {}).items()}
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
        remove(tmp)
        raise

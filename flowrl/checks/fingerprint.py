"""Weight fingerprints: a cheap number per parameter that two layouts of one model agree on.

A parameter ``X`` of shape ``(d0, .., dk)`` is fingerprinted by a fixed random rank-1
projection, ``f(X) = sum X[i0, .., ik] * v0[i0] * .. * vk[ik]``, with one standard-normal vector
per dimension seeded by the parameter's name and shape (the same on every process, on any
device). ``f`` is linear and separable, so it adds up over any cut of ``X`` into blocks along one
dimension: each rank computes it over the pieces it holds (its tp/pp shard, by the shard spec's
:class:`~flowrl.parallel.shard_spec.Piece` list, or whole HF tensors), and the sync node sums the
ranks of one replica and compares the sums of the two sides (:func:`compare`). A corrupted or
stale slice changes ``f`` unless the change is orthogonal to a random vector (probability 0).

Exactness: every block is accumulated in float64 (in chunks of at most :data:`CHUNK` elements),
so two sides holding the same fp32 values agree to about 1e-16 of ``s(X) = f(|X|; |v|)``; the
comparison allows ``RTOL`` x ``s``. Where a side holds bf16 (a bf16 wire or a bf16 engine), the
source also fingerprints its values rounded to bf16 (``rounded``), which is what arrives (bf16
rounding is idempotent), and the comparison takes that one: still exact, so a stale parameter
whose update moved any bf16 value is caught too.

Cost: one pass over the tensors a rank holds (two on a source rank with an fp32 wire: native and
rounded), a matrix-vector product per chunk; the node's comparison is over numbers per parameter.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from flowrl.checks.base import CheckFailed, Verdict

if TYPE_CHECKING:
    import torch

    from flowrl.parallel.shard_spec import ShardSpec

CHUNK = 1 << 22
"""Elements converted to float64 at once (32 MiB)."""
RTOL = 1e-9
"""Allowed |f_src - f_dst| relative to ``s``: float64 accumulation error, far below any real change."""
SEED = 0x5EED


@dataclass(frozen=True)
class Mismatch:
    """One parameter whose fingerprints differ: the generation ranks of the replica that holds the
    wrong value (``dst_ranks``), the trainer ranks it came from, and the numbers."""

    param: str
    dst_ranks: tuple[int, ...]
    src_ranks: tuple[int, ...]
    expected: float
    got: float | None  # None: the replica does not hold the parameter at all
    scale: float

    def describe(self) -> str:
        where = f"generation rank{'s' * (len(self.dst_ranks) > 1)} {list(self.dst_ranks)}"
        if self.got is None:
            return f"{self.param}: never reached {where} (trainer ranks {list(self.src_ranks)} hold it)"
        rel = abs(self.got - self.expected) / self.scale if self.scale else math.inf
        return (f"{self.param}: {where} hold fingerprint {self.got:.6g}, trainer ranks {list(self.src_ranks)} "
                f"{self.expected:.6g} (off by {rel:.2g} of its scale)")


def _vectors(name: str, shape: tuple[int, ...], device: Any) -> list["torch.Tensor"]:
    return [v.to(device) for v in _cpu_vectors(name, tuple(shape))]


_CACHE: dict[tuple[str, tuple[int, ...]], list] = {}


def _cpu_vectors(name: str, shape: tuple[int, ...]) -> list["torch.Tensor"]:
    import torch

    key = (name, shape)
    if key not in _CACHE:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        base = zlib.crc32(f"{name}|{shape}".encode()) ^ SEED
        out = []
        for k, n in enumerate(shape):
            gen = torch.Generator().manual_seed(base * 31 + k)
            out.append(torch.randn(n, generator=gen, dtype=torch.float64))
        _CACHE[key] = out
    return _CACHE[key]


def block_fingerprint(block: "torch.Tensor", vectors: list["torch.Tensor"], *, rounded: bool = False,
                      both: bool = False) -> tuple[float, float] | tuple[tuple[float, float], tuple[float, float]]:
    """(f, s) of ``block`` against its per-dimension ``vectors`` (each of the block's length along
    its dimension): f the projection, s the projection of ``|block|`` on ``|v|`` (the scale of f).
    ``rounded``: of the block's values rounded to bf16. ``both``: ((f, s), (f, s) rounded) in
    one pass over the block (a source whose receiver may hold either)."""
    import torch

    if block.ndim == 0:
        block = block.reshape(1)
        vectors = [torch.ones(1, dtype=torch.float64, device=block.device)]
    rows = block.shape[0]
    per_row = max(1, block[0].numel()) if rows else 1
    step = max(1, CHUNK // per_row)
    absv = [v.abs() for v in vectors]
    kinds = (False, True) if both else (rounded,)
    sums = [[0.0, 0.0] for _ in kinds]
    for r0 in range(0, rows, step):
        chunk = block[r0:r0 + step]
        for acc, rnd in zip(sums, kinds):
            x = (chunk.to(torch.bfloat16) if rnd else chunk).to(torch.float64)
            y, ya = x, x.abs()
            for k in range(block.ndim - 1, 0, -1):  # contract the last dimension first
                y, ya = y @ vectors[k], ya @ absv[k]
            acc[0] += float(vectors[0][r0:r0 + step] @ y)
            acc[1] += float(absv[0][r0:r0 + step] @ ya)
    out = [(f, s) for f, s in sums]
    return (out[0], out[1]) if both else out[0]


WHOLE = "*"
"""The region key of a whole parameter (a piece's key is ``dim:start:stop``)."""

Parts = dict  # HF parameter -> {region key -> (f, s)}


def state_fingerprints(state: Mapping[str, "torch.Tensor"], *, rounded: bool = False) -> Parts:
    """Whole tensors by name (an HF state, adapters): name -> {``*``: (f, s)}."""
    import torch

    with torch.no_grad():
        return {name: {WHOLE: block_fingerprint(t.detach(), _vectors(name, tuple(t.shape), t.device), rounded=rounded)}
                for name, t in state.items()}


def state_fingerprints_both(state: Mapping[str, "torch.Tensor"]) -> tuple[Parts, Parts]:
    """:func:`state_fingerprints` native and rounded to bf16, in one pass."""
    import torch

    native: Parts = {}
    rounded: Parts = {}
    with torch.no_grad():
        for name, t in state.items():
            a, b = block_fingerprint(t.detach(), _vectors(name, tuple(t.shape), t.device), both=True)
            native[name], rounded[name] = {WHOLE: a}, {WHOLE: b}
    return native, rounded


def shard_fingerprints(spec: "ShardSpec", rank: int, tensors: Mapping[str, "torch.Tensor"], *,
                       rounded: bool = False, both: bool = False) -> Parts | tuple[Parts, Parts]:
    """The pieces rank ``rank`` of ``spec`` holds in ``tensors`` (its local tensors): HF parameter
    -> {the piece's region: (f, s)} (a piece that is the whole parameter: ``*``). Ranks of one
    replica that hold the same region (a norm weight every tp rank holds) count it once.
    ``both``: (native, rounded to bf16), in one pass."""
    import torch

    from flowrl.parallel.shard_spec import piece_index

    out: Parts = {}
    out_rounded: Parts = {}
    with torch.no_grad():
        for piece in spec.shard_of(rank).pieces:
            shape = spec.params[piece.param]
            local = tensors[piece.local].detach()
            block = local[piece_index(piece, local=True, ndim=len(shape))]
            vectors = _vectors(piece.param, shape, local.device)
            vectors[piece.dim] = vectors[piece.dim][piece.start:piece.stop]
            whole = piece.start == 0 and piece.stop == shape[piece.dim]
            key = WHOLE if whole else f"{piece.dim}:{piece.start}:{piece.stop}"
            if both:
                a, b = block_fingerprint(block, vectors, both=True)
                out.setdefault(piece.param, {})[key] = a
                out_rounded.setdefault(piece.param, {})[key] = b
            else:
                out.setdefault(piece.param, {})[key] = block_fingerprint(block, vectors, rounded=rounded)
    return (out, out_rounded) if both else out


def replica_of(spec: "ShardSpec", rank: int) -> int:
    """The replica a rank of ``spec``'s layout belongs to: its dp rank without expert parallelism;
    with it, the replica of the rank's shard key (``ParallelDims.shard_replica``): a dense dp
    replica holds only its expert-parallel ranks' experts, the ranks of one key replica hold all."""
    return spec.dims.shard_replica(rank)


def report(side: str, rank: int, replica: int, parts: Mapping[str, tuple[float, float]], *, dtype: str,
           rounded: Mapping[str, tuple[float, float]] | None = None, seconds: float = 0.0) -> dict:
    """What one rank sends the node (picklable numbers): ``side`` ``src`` (trainer) or ``dst``
    (generation), its rank and replica, its parts, the dtype its values are in, the bf16-rounded
    parts (a source with an fp32 wire) and the seconds it took."""
    return {"side": side, "rank": rank, "replica": replica, "parts": dict(parts), "dtype": dtype,
            "rounded": dict(rounded) if rounded is not None else None, "seconds": seconds}


def _sum_replicas(reports: Iterable[dict], key: str = "parts") -> dict[int, tuple[dict[str, list[float]], list[int]]]:
    """Per replica: parameter -> [f, s] summed over its distinct regions (a region several ranks
    of the replica hold counts once), and the replica's ranks."""
    regions: dict[int, dict[str, dict[str, tuple[float, float]]]] = {}
    ranks: dict[int, list[int]] = {}
    for r in reports:
        ranks.setdefault(r["replica"], []).append(r["rank"])
        held = regions.setdefault(r["replica"], {})
        for name, parts in (r[key] or {}).items():
            for region, fs in parts.items():
                held.setdefault(name, {}).setdefault(region, fs)
    return {rep: ({name: [sum(f for f, _ in parts.values()), sum(s for _, s in parts.values())]
                   for name, parts in held.items()}, ranks[rep]) for rep, held in regions.items()}


def compare(reports: list[dict], *, rtol: float = RTOL) -> tuple[list[Mismatch], int]:
    """Compare every generation replica with the trainer: (mismatches, parameters compared).
    The trainer's first replica is the reference (its others are compared too: trainer ranks that
    disagree name themselves as ``dst_ranks`` of a ``src`` replica). Where a generation rank or
    the wire holds bf16, the source's rounded parts are the reference."""
    src = [r for r in reports if r["side"] == "src"]
    dst = [r for r in reports if r["side"] == "dst"]
    if not src or not dst:
        return [], 0
    bf16 = any(r["dtype"] == "bfloat16" for r in dst)
    ref_key = "rounded" if bf16 and all(r["rounded"] is not None for r in src) else "parts"
    src_sums = _sum_replicas(src, ref_key)
    first = min(src_sums)
    want, src_ranks = src_sums[first]
    mismatches: list[Mismatch] = []
    groups = [(ranks, sums) for _, (sums, ranks) in sorted(_sum_replicas(dst).items())]
    groups += [(ranks, sums) for rep, (sums, ranks) in sorted(src_sums.items()) if rep != first]
    for ranks, sums in groups:
        holders = tuple(sorted(ranks))
        for name, (f, s) in want.items():
            got = sums.get(name)
            tol = rtol * max(s, got[1] if got else 0.0) + 1e-30
            if got is None or abs(got[0] - f) > tol:
                mismatches.append(Mismatch(name, holders, tuple(sorted(src_ranks)), f, got[0] if got else None, s))
    return mismatches, len(want)


def trainer_total(reports: list[dict]) -> float | None:
    """The trainer's weights as one number: the sum of its reference replica's fingerprints, in
    the values :func:`compare` holds the engine to (bf16-rounded where the engine is bf16); the
    ``engine_moved`` check compares it from one sync to the next. None without a trainer report."""
    src = [r for r in reports if r["side"] == "src"]
    if not src:
        return None
    bf16 = any(r["dtype"] == "bfloat16" for r in reports if r["side"] == "dst")
    key = "rounded" if bf16 and all(r["rounded"] is not None for r in src) else "parts"
    sums = _sum_replicas(src, key)
    return float(sum(f for f, _ in sums[min(sums)][0].values()))


class WeightSyncMismatch(CheckFailed):
    """The weights a generation engine holds after a sync are not the trainer's
    (``trainer.checks.weight_sync=error``): the check ``weight_sync``'s failure, raised in the sync
    node (so it crosses processes: built from its message alone, which pickles)."""

    def __init__(self, message: str) -> None:
        RuntimeError.__init__(self, message)
        self.name, self.step, self.verdict = "weight_sync", 0, Verdict(False, math.nan, message)


def mismatch_message(mismatches: list[Mismatch], compared: int, step: int | None = None) -> str:
    at = f" after the weight sync of step {step}" if step is not None else " after the weight sync"
    shown = "; ".join(m.describe() for m in mismatches[:3])
    more = f" (and {len(mismatches) - 3} more)" if len(mismatches) > 3 else ""
    return (f"check weight_sync failed{at}: {len(mismatches)} of {compared} parameters differ between the trainer "
            f"and the generation engine: {shown}{more}. Likely cause: a partial or corrupted transfer, or an "
            "engine that did not apply the update (it keeps sampling old weights) "
            "(trainer.checks.weight_sync=warn to log it and go on, =off to skip it)")


# ----------------------------------------------------------------------------- the ranks' side
def _dtype_name(tensors: Iterable["torch.Tensor"]) -> str:
    import torch

    return "bfloat16" if any(t.dtype == torch.bfloat16 for t in tensors) else "float32"


def _source_parts(fn: Any, *, wire: str, src_dtype: str) -> tuple[dict, dict | None]:
    """A source's parts in the dtype the wire carries and rounded to bf16 (what a bf16 engine
    receives): one pass computing both from fp32 values on an fp32 wire, else the rounded ones
    (which are then the values that travel)."""
    if wire == "bfloat16" or src_dtype == "bfloat16":
        parts = fn(rounded=True)
        return parts, parts
    return fn(both=True)


def source_report(job: Any, rank: int, tensors: Mapping[str, "torch.Tensor"]) -> dict:
    """Trainer rank ``rank`` of ``job`` (a ``ReshardJob``) with its local tensors: its report."""
    import time

    start = time.perf_counter()
    spec = job.specs()[0]
    held = [tensors[name] for name in spec.shard_of(rank).tensors]
    parts, rounded = _source_parts(lambda **kw: shard_fingerprints(spec, rank, tensors, **kw),
                                   wire=job.wire_dtype, src_dtype=_dtype_name(held))
    return report("src", rank, replica_of(spec, rank), parts, dtype=job.wire_dtype, rounded=rounded,
                  seconds=time.perf_counter() - start)


def applied_state(engine: Any, names: Iterable[str]) -> dict[str, "torch.Tensor"] | None:
    """The weights a generation engine computes with, by HF name, read from the engine itself
    (its ``applied_state()``, else its module's parameters): not the tensors the transport wrote,
    so an engine whose target tensors are copies (the update goes nowhere) is seen as it is.
    None when the engine offers neither (or lacks one of ``names``)."""
    own = getattr(engine, "applied_state", None)
    if callable(own):
        state = own()
    else:
        model = getattr(engine, "model", None)
        if model is None or not hasattr(model, "named_parameters"):
            return None
        state = {n: p.detach() for n, p in model.named_parameters()}
    names = list(names)
    if any(n not in state for n in names):
        return None
    return {n: state[n] for n in names}


def target_report(job: Any, rank: int, tensors: Mapping[str, "torch.Tensor"] | None, *, engine: Any = None,
                  state: Mapping[str, "torch.Tensor"] | None = None) -> dict:
    """Generation rank ``rank`` of ``job`` after the sync: the engine's own weights where it can
    read them (``engine``: whole parameters, :func:`applied_state`; ``state``: the whole tensors
    this rank loaded into its engine, a staged engine's replica rank), else its local
    ``tensors`` (what the transport wrote) by the spec's pieces."""
    import time

    start = time.perf_counter()
    spec = job.specs()[1]
    shard = spec.shard_of(rank)
    whole = all(p.start == 0 and p.stop == spec.params[p.param][p.dim] for p in shard.pieces)
    live = applied_state(engine, shard.by_param()) if engine is not None and whole else None
    if live is not None:
        parts, dtype = state_fingerprints(live), _dtype_name(live.values())
    elif state is not None:
        parts, dtype = state_fingerprints(state), _dtype_name(state.values())
    elif tensors is not None:
        parts, dtype = shard_fingerprints(spec, rank, tensors), _dtype_name(tensors.values())
    else:  # a rank of a staged replica that loads nothing itself: its engine rank reports the whole
        parts, dtype = {}, job.wire_dtype
    return report("dst", rank, replica_of(spec, rank), parts, dtype=dtype, seconds=time.perf_counter() - start)


def adapter_source_report(job: Any, tensors: Mapping[str, "torch.Tensor"]) -> dict:
    """Trainer rank 0 of an ``AdapterJob``: its adapters (and peft's whole modules) by the names
    they travel under (``flowrl.backends.train.lora.sync_names``)."""
    import time

    start = time.perf_counter()
    parts, rounded = _source_parts(lambda both=False, **kw: state_fingerprints_both(tensors) if both
                                   else state_fingerprints(tensors, **kw),
                                   wire=job.wire_dtype, src_dtype=_dtype_name(tensors.values()))
    return report("src", 0, 0, parts, dtype=job.wire_dtype, rounded=rounded, seconds=time.perf_counter() - start)


def adapter_target_report(job: Any, rank: int, installed: Mapping[str, "torch.Tensor"] | None) -> dict | None:
    """Generation rank ``rank`` of an ``AdapterJob``: the adapters it installed in its engine
    (None on a rank that holds no engine; an engine rank that installed nothing reports no part)."""
    import time

    if job.src_world_size + rank not in job.receivers():
        return None
    start = time.perf_counter()
    parts = state_fingerprints(installed) if installed else {}
    return report("dst", rank, rank // job.dst_tp, parts, dtype=job.wire_dtype, seconds=time.perf_counter() - start)


def attach(stats: dict, *reports: dict | None) -> dict:
    """``stats`` (a rank's reshard statistics) with its fingerprint reports under ``fingerprint``."""
    stats["fingerprint"] = [r for r in reports if r is not None]
    return stats

"""The on-disk format of a checkpoint and the helpers saving and loading share: names of the
marker files, the dtype storage (``bfloat16`` as ``uint16`` bit patterns), atomic file writes,
crash leftovers, and the shard addressing of a rank.

See ``zarr_store`` for the layout and the save protocol, ``loading`` for reading it back.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

if TYPE_CHECKING:
    from flowrl.parallel.shard_spec import RankShard, ShardSpec

FORMAT = "flowrl-checkpoint"
FORMAT_VERSION = 1
META = "meta.json"
PENDING = "pending.json"
LATEST = "latest"
TMP_MARK = ".tmp-"
OLD_MARK = ".old-"


# -- dtypes -----------------------------------------------------------------------------------

def dtype_name(dtype: Any) -> str:
    """Logical dtype name of a torch / numpy dtype or a name (``"bfloat16"`` allowed)."""
    text = str(dtype)
    if text.startswith("torch."):
        return text.removeprefix("torch.")
    return "bfloat16" if text == "bfloat16" else np.dtype(dtype).name


def storage_dtype(logical: str) -> str:
    return "uint16" if logical == "bfloat16" else logical


def to_numpy(x: Any) -> tuple[np.ndarray, str]:
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


def from_storage(a: np.ndarray, logical: str, as_torch: bool) -> Any:
    if not as_torch:
        return a
    import torch

    if logical == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# -- files ------------------------------------------------------------------------------------

def write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def recover_replaced(root: str) -> None:
    """Put back a checkpoint moved aside (``<path>.old-<uuid>``) by a save that died before its
    replacement was renamed into ``<path>``."""
    for entry in os.listdir(root):
        original = os.path.join(root, entry.split(OLD_MARK)[0])
        full = os.path.join(root, entry)
        if OLD_MARK in entry and not os.path.exists(original) and \
                os.path.isfile(os.path.join(full, META)):
            os.replace(full, original)


def clean_leftovers(root: str) -> None:
    """Remove temporary directories / files of crashed saves under ``root``."""
    if os.path.isdir(root):
        recover_replaced(root)
        for entry in os.listdir(root):
            if TMP_MARK in entry or OLD_MARK in entry:
                remove(os.path.join(root, entry))


def checkpoint_dir(root: str | os.PathLike, step: int) -> str:
    """The conventional directory of step ``step``'s checkpoint: ``<root>/step_00000010``."""
    return os.path.join(os.fspath(root), f"step_{step:08d}")


# -- shards -----------------------------------------------------------------------------------

def shard_key(spec: ShardSpec, rank: int | tuple[int, ...] | RankShard) -> tuple[tuple[int, ...],
                                                                                    bool]:
    """(shard key, whether this rank is a replica of its key other than the first): the key is
    ``(tp_rank, pp_rank)``, with ``(ep_rank, etp_rank)`` under expert parallelism."""
    if isinstance(rank, tuple):
        return rank, False
    if hasattr(rank, "tp_rank"):
        return rank.key, False
    return spec.dims.shard_key(rank), spec.dims.shard_replica(rank) != 0


def dim_index(dim: int, lo: int, hi: int) -> tuple[slice, ...]:
    return (slice(None),) * dim + (slice(lo, hi),)


def local_index(piece: Any, lo: int, hi: int) -> tuple[Any, ...]:
    """``[lo, hi)`` along ``piece.dim`` of its local tensor (of one fused expert, ``piece.index``)."""
    lead = () if piece.index is None else (piece.index,)
    return lead + dim_index(piece.dim, lo, hi)


FIX = ("point resume at a complete checkpoint (latest_checkpoint(root) skips broken ones) or start "
        "fresh with trainer.resume_mode=disable")


def check_shapes(where: str, saved: Mapping[str, tuple[int, ...]],
                  expected: Mapping[str, tuple[int, ...]], target: str) -> None:
    problems = [f"{n} is missing" for n in expected if n not in saved]
    problems += [f"{n} is not in {target}" for n in saved if n not in expected]
    problems += [f"{n} has shape {tuple(saved[n])}, {target} expects {tuple(expected[n])}"
                 for n in expected if n in saved and tuple(saved[n]) != tuple(expected[n])]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ValueError(f"{where} holds a different model than {target}: "
                         f"{'; '.join(problems[:3])}{more}; {FIX}")

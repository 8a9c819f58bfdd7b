"""How much host memory each worker process may hold (``cluster.memory_limit``), decided in the
driver before any worker starts. Pure, apart from :func:`checkpoint_bytes` (file sizes, no read)
and :func:`local_memory_limit` (this machine's memory and GPUs).

Dask's nanny kills a worker whose resident memory passes its limit. A rank that loads a model
must be allowed what loading needs, or the run dies in the middle of the load with a "worker
exceeded 95% memory budget" line far from the cause.

What loading needs, per worker (:func:`load_bytes`), counted in checkpoint bytes ``C`` (the sizes
of the ``*.safetensors`` files under ``model.path``, in the checkpoint's own dtype):

* ``1 x C``: the checkpoint's pages. safetensors maps the files; the pages a rank touches are
  file-backed but resident, and Dask's nanny counts them (it reads the process's RSS). A rank that
  reads the whole file (today's megatron path; the rank 0 of a broadcast load) touches all of it.
* ``1 x C``: one full copy of the model materialised from those pages (``from_pretrained`` on
  every rank today; rank 0 of a broadcast load). A rank that loads only its shard holds less.
* :data:`RUNTIME_BYTES`: the interpreter with torch, transformers and Dask imported.

So ``LOAD_FACTOR = 2`` copies of the checkpoint plus the runtime: an upper bound for the meta-device
loaders (a shard is at most a full copy) and exact for today's whole-model load. Host state kept
after the load (offloaded parameters or optimizer states, ``actor.fsdp_config.*_offload``) comes on
top, as ``extra_bytes``: the caller knows its shard.

``cluster.memory_limit`` (resolved by :func:`resolve_memory_limit`):

* a size (``4GiB``), a fraction of the machine (``0.25``) or ``0``/``none``: as written, given to
  Dask; a size below what loading needs is warned about (the estimate is an upper bound, so it is
  not refused);
* ``auto``: the node's memory less :data:`NODE_RESERVE_FRACTION` (the OS, the driver, the page
  cache of other files) divided by the worker processes on it; refused, naming
  ``cluster.memory_limit`` and the fix, when that share is below what loading needs;
* ``default`` (the default): ``auto`` on a machine with GPUs (a GPU run's models are large and its
  nodes have the memory), :data:`CPU_DEFAULT` (``4GiB``) without, as every CPU run had before.

Dask's own ``auto`` is *not* the memory per worker: it is the memory times threads per worker over
the machine's cores (1/128 of a 128-core node per worker), hence bytes computed here.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger(__name__)

__all__ = ["CPU_DEFAULT", "DEFAULT", "LOAD_FACTOR", "NODE_RESERVE_FRACTION", "RUNTIME_BYTES", "checkpoint_bytes",
           "load_bytes", "local_memory_limit", "resolve_memory_limit", "worker_memory_limit"]

GiB = 1 << 30
DEFAULT = "default"
"""``cluster.memory_limit``'s default: ``auto`` with GPUs, :data:`CPU_DEFAULT` without."""
CPU_DEFAULT = "4GiB"
"""The limit of a CPU run by default (unchanged from before ``auto`` learnt the model's size)."""
LOAD_FACTOR = 2.0
"""Copies of the checkpoint a loading worker may hold at once: its mapped pages + one full copy."""
RUNTIME_BYTES = 1 * GiB
"""A worker's own footprint with torch, transformers and Dask imported (measured: 0.6-0.9 GiB)."""
NODE_RESERVE_FRACTION = 0.1
"""Share of the node's memory ``auto`` leaves to the OS, the driver and the rest."""
CHECKPOINT_SUFFIXES = (".safetensors",)
FALLBACK_SUFFIXES = (".bin", ".pt", ".pth")


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def checkpoint_bytes(model_path: str | os.PathLike | None) -> int:
    """The bytes of the model's weights under ``model_path``, from the file sizes alone (nothing
    is read): the ``*.safetensors`` files, else the ``*.bin``/``*.pt`` ones; 0 when the path is
    not a local directory (a hub name, empty) or holds none: the size is unknown."""
    if not model_path:
        return 0
    root = Path(model_path)
    if not root.is_dir():
        return 0
    for suffixes in (CHECKPOINT_SUFFIXES, FALLBACK_SUFFIXES):
        files = [p for p in root.iterdir() if p.is_file() and p.name.endswith(suffixes)]
        if files:
            return sum(p.stat().st_size for p in files)
    return 0


def load_bytes(ckpt_bytes: int, *, extra_bytes: int = 0) -> int:
    """Host memory one worker needs to load a checkpoint of ``ckpt_bytes`` (see the module
    docstring): ``LOAD_FACTOR x ckpt_bytes + RUNTIME_BYTES + extra_bytes``."""
    return int(LOAD_FACTOR * ckpt_bytes) + RUNTIME_BYTES + int(extra_bytes)


def worker_memory_limit(*, host_bytes: int, workers: int, ckpt_bytes: int = 0, extra_bytes: int = 0) -> int:
    """``auto``: each of ``workers`` processes on a node of ``host_bytes`` gets an equal share of
    the node less :data:`NODE_RESERVE_FRACTION`, in bytes. Raises ``ConfigError`` (key
    ``cluster.memory_limit``) when the share is below :func:`load_bytes` of the checkpoint (a
    ``ckpt_bytes`` of 0, unknown, checks only the runtime)."""
    from flowrl.config.errors import ConfigError

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    share = int(host_bytes * (1 - NODE_RESERVE_FRACTION)) // workers
    need = load_bytes(ckpt_bytes, extra_bytes=extra_bytes)
    if share < need:
        model = f"a {_gib(ckpt_bytes)} checkpoint" if ckpt_bytes else "no known checkpoint"
        fits = int(host_bytes * (1 - NODE_RESERVE_FRACTION)) // need
        raise ConfigError(
            "cluster.memory_limit", "auto",
            f"gives each of {workers} worker processes {_gib(share)} of this node's {_gib(host_bytes)}, below the "
            f"{_gib(need)} loading {model} needs ({LOAD_FACTOR:g} x checkpoint + {_gib(RUNTIME_BYTES)} runtime"
            + (f" + {_gib(extra_bytes)} offloaded state" if extra_bytes else "") + ")",
            f"run at most {fits} worker process(es) per node (fewer ranks, or more nodes), use a node with more "
            f"memory, or set cluster.memory_limit to a size you know suffices (e.g. {_gib(need).replace(' ', '')})")
    return share


def _requested_bytes(value: str, host_bytes: int) -> int | None:
    """A size or fraction as bytes; None for no limit."""
    from dask.utils import parse_bytes

    text = str(value).strip().lower()
    if text in ("0", "none"):
        return None
    try:
        number = float(text)
    except ValueError:
        return int(parse_bytes(text))
    return int(number * host_bytes) if number <= 1 else int(number)


def resolve_memory_limit(value: str, *, workers: int, has_gpus: bool, host_bytes: int, ckpt_bytes: int = 0,
                         extra_bytes: int = 0) -> str | int:
    """What Dask gets as each worker's ``memory_limit`` for ``cluster.memory_limit=value`` (see
    the module docstring): bytes for ``auto`` (and ``default`` on a GPU machine), else the value
    as written. Refuses ``auto`` when the node cannot hold the load; warns about a written size
    below it."""
    text = str(value).strip().lower()
    if text == DEFAULT:
        text = "auto" if has_gpus else CPU_DEFAULT.lower()
        value = "auto" if has_gpus else CPU_DEFAULT
    if text == "auto":
        return worker_memory_limit(host_bytes=host_bytes, workers=workers, ckpt_bytes=ckpt_bytes,
                                   extra_bytes=extra_bytes)
    limit = _requested_bytes(text, host_bytes)
    need = load_bytes(ckpt_bytes, extra_bytes=extra_bytes)
    if ckpt_bytes and limit is not None and limit < need:
        msg = (f"flowrl: cluster.memory_limit={value} gives each worker {_gib(limit)}, below the {_gib(need)} loading "
               f"a {_gib(ckpt_bytes)} checkpoint may need: Dask may kill a worker while it loads; "
               f"set cluster.memory_limit=auto or a larger size")
        log.warning(msg)
        print(f"WARNING: {msg}", file=sys.stderr, flush=True)
    return value


def local_memory_limit(value: str, *, workers: int, model_path: str = "", environ: Mapping[str, str] | None = None,
                       runner: Any = None, host_bytes: int | None = None, extra_bytes: int = 0) -> str | int:
    """:func:`resolve_memory_limit` for a LocalCluster of ``workers`` processes on this machine:
    its memory (Dask's reading, which honours cgroup limits), its GPUs as the device plan sees
    them (``FLOWRL_DEVICES``, ``CUDA_VISIBLE_DEVICES``, ``nvidia-smi -L``; asked only for
    ``default``) and the checkpoint under ``model_path``, plus ``extra_bytes`` of state a worker
    keeps on the host after loading (``flowrl.run.memory_check.offloaded_bytes``)."""
    text = str(value).strip().lower()
    if text not in (DEFAULT, "auto") and not model_path:
        return value  # a written limit, nothing to check it against
    has_gpus = False
    if text == DEFAULT:
        from flowrl.cluster.inventory import machine_inventory

        has_gpus = machine_inventory(environ, runner).has_gpus
    if host_bytes is None:
        from distributed.system import MEMORY_LIMIT

        host_bytes = MEMORY_LIMIT
    return resolve_memory_limit(value, workers=workers, has_gpus=has_gpus, host_bytes=host_bytes,
                                ckpt_bytes=checkpoint_bytes(model_path), extra_bytes=extra_bytes)

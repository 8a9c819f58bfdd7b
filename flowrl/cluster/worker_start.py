"""How a LocalCluster starts its worker processes: forked from one server that has already
imported torch and transformers, instead of a fresh interpreter per worker.

A spawned worker pays the imports of torch, transformers and flowrl's roles (seconds of CPU
each) before it can hold a rank; a run starts 5-7 of them, and the nanny starts another after
every lost worker. With ``multiprocessing``'s ``forkserver`` method the imports run once, in a
server process started from a clean interpreter (not forked from the driver, so nothing the
driver initialised, a CUDA context included, is inherited); each worker is a fork of that server,
which never computes. Measured on the 2-core machine at load ~17: 7 workers ready with those
imports in 36 s instead of 81 s; a second cluster in the same process reuses the server.

A forked worker gets the driver's ``sys.path`` as a spawned one does (multiprocessing sends it
with every start), but its environment would be the server's, fixed when the server started:
:func:`worker_env` gives the nanny the driver's environment as it is when the cluster starts.
A forked worker also starts with the server's umask, until its preload
(``flowrl.cluster.worker_setup``) sets the run's policy, and Dask makes its scratch folder's lock
files before that. :func:`use` therefore starts the server itself, under umask 077: what a worker
makes before its preload is then private whatever the umask of the process that first started a
run (a notebook or test process that ran another ``trainer.file_mode`` before).
``cluster.start_method=spawn`` keeps Dask's default.
"""

from __future__ import annotations

import os

#: Modules the fork server imports once for every worker it forks.
PRELOAD = (
    "torch",
    "transformers",
    "pyarrow",
    "flowrl.actors.rank",
    "flowrl.roles.policy",
    "flowrl.roles.rollout",
    "flowrl.backends.train.dp_policy",
    "flowrl.backends.generate.hf",
    # what the first model load imports lazily: about 6 s of CPU per worker on the 2-core machine
    # (transformers' auto classes and the generation and modeling utilities), paid once here.
    # Measured (tiny model, 1 GRPO step, load 8-12): a second run in the same process (a
    # notebook) 21.3 -> 6.6 s and 24.0 -> 11.3 s; a process's first run unchanged (38 s)
    "transformers.models.auto.modeling_auto",
    "transformers.modeling_utils",
    "transformers.generation.utils",
)


def model_modules(model_path: str) -> tuple[str, ...]:
    """The transformers modeling module of the model at ``model_path`` (from its ``config.json``
    ``model_type``), for the fork server to import once: () when there is no such file, module or
    type (the worker then imports it at load, as before)."""
    import importlib.util
    import json
    from pathlib import Path

    try:
        model_type = json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return ()
    if not isinstance(model_type, str) or not model_type.replace("-", "_").isidentifier():
        return ()
    name = model_type.replace("-", "_")
    module = f"transformers.models.{name}.modeling_{name}"
    try:
        return (module,) if importlib.util.find_spec(module) is not None else ()
    except (ImportError, ValueError):
        return ()


def resolve(method: str, *, has_gpus: bool) -> str:
    """``cluster.start_method`` with ``auto`` resolved: ``spawn`` when the machine has GPUs (the
    fork server imports torch and transformers, and a fork after anything there initialised the
    CUDA driver leaves the worker unable to use CUDA), else ``forkserver``."""
    if method != "auto":
        return method
    return "spawn" if has_gpus else "forkserver"


def use(method: str, extra: tuple[str, ...] = ()) -> None:
    """Make this process's Dask nannies start workers with ``method`` (``forkserver`` with
    :data:`PRELOAD` and ``extra`` (:func:`model_modules`) imported in the server, or ``spawn``).
    Applies to every worker started afterwards, restarts after a lost worker included. The
    preload list counts only if the server is not running yet (it runs for the rest of the
    process)."""
    import dask

    dask.config.set({"distributed.worker.multiprocessing-method": method})
    if method != "forkserver":
        return
    import multiprocessing

    from distributed.utils import get_mp_context

    get_mp_context()  # distributed's own preload list first (it sets it once per process)
    import multiprocessing.forkserver as forkserver

    already = list(getattr(forkserver._forkserver, "_preload_modules", None) or [])
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        already + [m for m in (*PRELOAD, *extra) if m not in already])
    old = os.umask(SERVER_UMASK)  # the server imports PRELOAD in its own process: this returns at once
    try:
        forkserver.ensure_running()
    finally:
        os.umask(old)


#: The fork server's umask (the strictest policy's): workers start with it, then take the run's.
SERVER_UMASK = 0o077


def worker_env(base: dict[str, str]) -> dict[str, str]:
    """The nanny ``env`` of a forked worker: this process's environment now, then ``base``."""
    return {**os.environ, **base}

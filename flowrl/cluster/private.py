"""The run's private directory: temporary files, multiprocessing's sockets and the rendezvous
stores of its process groups, where only this user can enter.

:func:`prepare` (called by ``start_cluster`` before any worker or fork server starts) makes one
directory per driver process with ``tempfile.mkdtemp`` (mode 0700, in the system temp dir) and
points ``TMPDIR`` and ``tempfile.tempdir`` at it, so what the driver and its LocalCluster
workers write as temporary files (Dask's scratch space when the run names none,
multiprocessing's ``pymp-*`` folder with the fork server's socket, torch's and pyarrow's
temporaries) lands inside it. ``FLOWRL_PRIVATE_DIR`` names it to the workers: the rendezvous of a
group whose ranks are all on this machine is a ``FileStore`` there (``flowrl.comm.store``), not
a TCP listener. The directory is removed when the process exits. SLURM jobs make their own
(``flowrl.cluster.job_script.PRIVATE_TMP``).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

ENV = "FLOWRL_PRIVATE_DIR"
"""The environment variable naming the run's private directory to its processes."""
HTTP_ENV = "FLOWRL_HTTP"
"""``off``: the worker starts no HTTP server (``flowrl.cluster.worker_setup``)."""
FILE_MODE_ENV = "FLOWRL_FILE_MODE"
"""The run's file-mode policy (``flowrl.data.file_modes``), applied by each worker at start."""

_MADE: list[Path] = []


def is_private(path: str | Path) -> bool:
    """Whether ``path`` is a real directory (not a link) of this user that no one else may enter."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def prepare() -> Path:
    """This process's private directory (made on the first call; see the module docstring)."""
    if _MADE:
        return _MADE[0]
    base = os.environ.get(ENV)
    if base and is_private(base):  # a process of the run (it inherited the directory)
        path = Path(base)
    else:
        path = Path(tempfile.mkdtemp(prefix="flowrl-run-", dir=_system_tmp()))
        from multiprocessing import util

        # at exit, after multiprocessing removed its pymp-* folder in it (priority -100) and
        # stopped the fork server: a finalizer of lower priority runs later
        util.Finalize(None, shutil.rmtree, args=(str(path), True), exitpriority=-200)
    _MADE.append(path)
    os.environ[ENV] = os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = str(path)
    _move_multiprocessing_tmp(path)
    return path


def _system_tmp() -> str:
    """The temp dir as the process found it (before :func:`prepare` moved ``TMPDIR``)."""
    return tempfile.gettempdir()


def _move_multiprocessing_tmp(path: Path) -> None:
    """Let multiprocessing make its ``pymp-*`` folder (the fork server's socket) under ``path``
    unless the fork server already runs (its socket then stays where it is, in a 0700 folder)."""
    import multiprocessing.forkserver as forkserver
    from multiprocessing import process

    if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:
        config = process.current_process()._config
        old = config.get("tempdir")
        if old and not str(old).startswith(str(path)):
            config["tempdir"] = None  # its finalizer still removes the old folder at exit


def worker_env(dashboard: bool, *, rendezvous: bool) -> dict[str, str]:
    """The environment that carries the run's settings to its workers: no HTTP server without
    the dashboard, the file-mode policy, and (``rendezvous``: all ranks on this machine) the
    private directory for the rendezvous stores."""
    env = {} if dashboard else {HTTP_ENV: "off"}
    if os.environ.get(FILE_MODE_ENV):
        env[FILE_MODE_ENV] = os.environ[FILE_MODE_ENV]
    if rendezvous:
        env[ENV] = str(prepare())
    return env

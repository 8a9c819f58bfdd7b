"""A Dask preload (``--preload flowrl.cluster.worker_setup``) that applies a run's settings in
each worker process before it starts serving: the file-mode policy (``FLOWRL_FILE_MODE``, as
the process's umask: ``flowrl.data.file_modes``) and, with ``FLOWRL_HTTP=off``, no HTTP server
(``flowrl.cluster.listeners``). Dask imports a preload module when the worker is built, before
its HTTP server would start."""

from __future__ import annotations

import os

import dask

from flowrl.cluster import listeners
from flowrl.cluster.private import FILE_MODE_ENV, HTTP_ENV
from flowrl.data import file_modes

if os.environ.get(FILE_MODE_ENV):
    file_modes.apply(os.environ[FILE_MODE_ENV])
if os.environ.get(HTTP_ENV) == "off":
    listeners.install()
    dask.config.set({"flowrl.http": False})

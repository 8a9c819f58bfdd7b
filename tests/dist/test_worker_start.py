"""Workers forked from the fork server (``cluster.start_method=forkserver``, the default) see what
a spawned worker sees: the driver's environment and ``sys.path`` as they are when the cluster
starts, even when both changed after the server started; and they arrive with torch imported."""

from __future__ import annotations

import os
import sys

import pytest

from flowrl.cluster import worker_start


def _probe() -> dict:
    import importlib

    return {
        "ppid": os.getppid(),
        "late_env": os.environ.get("FLOWRL_TEST_LATE_ENV"),
        "late_module": importlib.import_module("flowrl_late_module").VALUE,
        "torch_preloaded": "torch" in sys.modules,
    }


@pytest.mark.timeout(300)
def test_forked_workers_see_the_drivers_env_and_path_at_cluster_start(tmp_path, monkeypatch):
    from distributed import Client, LocalCluster

    import multiprocessing.forkserver

    worker_start.use("forkserver")
    multiprocessing.forkserver.ensure_running()  # the server starts before the changes below
    (tmp_path / "flowrl_late_module.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FLOWRL_TEST_LATE_ENV", "late")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                      env=worker_start.worker_env({"OMP_NUM_THREADS": "1"})) as cluster, Client(cluster, timeout=120) as client:
        client.wait_for_workers(1, timeout=120)
        (seen,) = client.run(_probe).values()
    assert seen["late_env"] == "late"
    assert seen["late_module"] == 42
    assert seen["torch_preloaded"], "the worker imported torch itself: it was not forked from the preloaded server"
    assert seen["ppid"] != os.getpid()  # a child of the fork server, not of the nanny in this process


def test_worker_env_carries_the_environment_the_base_and_the_path():
    env = worker_start.worker_env({"OMP_NUM_THREADS": "1", "PATH": "/base"})
    assert env["OMP_NUM_THREADS"] == "1" and env["PATH"] == "/base"  # the base wins
    assert set(os.environ) - {"PATH", "OMP_NUM_THREADS"} <= set(env)

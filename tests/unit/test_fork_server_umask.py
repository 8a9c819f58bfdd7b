"""The fork server that starts a LocalCluster's workers (flowrl/cluster/worker_start.py): a
worker it forks makes files under umask 077 until its preload sets the run's policy, whatever
the umask of the process that asked for it (the CI failure of test_listeners: a pytest process
whose fork server was started under 022 by an earlier run gave Dask's scratch locks 0644)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_forked_workers_start_private_whatever_the_callers_umask(tmp_path):
    script = textwrap.dedent(f"""
        import multiprocessing, os, pathlib, stat
        from flowrl.cluster import worker_start
        worker_start.PRELOAD = ()           # the server's imports do not matter here
        os.umask(0o022)                     # the notebook or test process's umask
        worker_start.use("forkserver")
        target = pathlib.Path({str(tmp_path)!r}) / "made-by-a-worker"
        proc = multiprocessing.get_context("forkserver").Process(target=target.touch)
        proc.start(); proc.join(60)
        print(proc.exitcode, oct(stat.S_IMODE(target.stat().st_mode)), oct(os.umask(0o022)))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    exitcode, mode, caller = out.stdout.split()
    assert exitcode == "0" and mode == "0o600", out.stdout
    assert caller == "0o22", "use() left the caller's umask changed"


def test_auto_start_method_spawns_on_a_gpu_machine_and_forks_on_cpu():
    from flowrl.cluster import worker_start
    from flowrl.cluster.inventory import machine_inventory
    from flowrl.config import load_config

    assert load_config(None, []).cluster.start_method == "auto"
    assert worker_start.resolve("auto", has_gpus=True) == "spawn"
    assert worker_start.resolve("auto", has_gpus=False) == "forkserver"
    assert worker_start.resolve("forkserver", has_gpus=True) == "forkserver"  # asked for by name: kept
    no_smi = lambda cmd: (_ for _ in ()).throw(FileNotFoundError(cmd[0]))  # noqa: E731
    assert machine_inventory({"FLOWRL_DEVICES": "cpu", "CUDA_VISIBLE_DEVICES": "0,1"}, no_smi).has_gpus is False
    assert machine_inventory({"CUDA_VISIBLE_DEVICES": "0,1"}, no_smi).gpus_per_node == 2
    assert machine_inventory({}, no_smi).has_gpus is False


def test_the_fork_server_also_imports_the_runs_own_model_module(tmp_path):
    """The model's modeling module (from its config.json) is imported once in the fork server,
    not in every worker at its first load; anything unknown adds nothing."""
    import json

    from flowrl.cluster.worker_start import PRELOAD, model_modules

    assert "transformers.models.auto.modeling_auto" in PRELOAD
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert model_modules(str(tmp_path)) == ("transformers.models.qwen2.modeling_qwen2",)
    for bad in ({"model_type": "no_such_model"}, {"model_type": "../x"}, {"model_type": 3}, {}):
        (tmp_path / "config.json").write_text(json.dumps(bad))
        assert model_modules(str(tmp_path)) == (), bad
    (tmp_path / "config.json").write_text("{not json")
    assert model_modules(str(tmp_path)) == ()
    assert model_modules(str(tmp_path / "missing")) == ()

"""Against a real SLURM (the single node cluster/slurm-test/setup.sh starts; .ci/run runs it):
GRPO with every worker a SLURM job, no jobs left after the run or after the client is killed by
SIGTERM, loopback-only sockets, and notebooks/slurm.ipynb executed."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from flowrl_testing.notebooks import check_outputs

REPO = Path(__file__).parents[2]


def _slurm_ready() -> str | None:
    """None when sbatch can run jobs here, else why not."""
    if not shutil.which("sinfo") or not shutil.which("sbatch"):
        return "SLURM is not installed (no sinfo/sbatch); cluster/slurm-test/setup.sh installs and starts one"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 20s (slurmctld down?); run cluster/slurm-test/setup.sh"
    states = out.stdout.split()
    if out.returncode != 0 or not any(s.startswith(("idle", "mixed", "allocated")) for s in states):
        return f"no usable SLURM node (sinfo: {out.stdout.strip() or out.stderr.strip()}); run cluster/slurm-test/setup.sh"
    try:
        import dask_jobqueue  # noqa: F401
    except ImportError:
        return "dask-jobqueue is not installed: pip install 'flowrl[slurm]'"
    return None


_WHY = _slurm_ready()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(_WHY is not None, reason=_WHY or "")]
PREFIX = "flowrltest"  # every job of these tests is named flowrltest<suffix>-<run id>


def _our_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()[1:] and line.split()[1].startswith(PREFIX)]


def _wait_no_jobs(timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    left = _our_jobs()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _our_jobs()
    return left


@pytest.fixture(autouse=True)
def no_jobs_left_behind():
    """Every test starts and ends with none of its jobs queued; teardown cancels stragglers so one
    failure cannot leak jobs into the next test (the assertions inside the tests are the checks)."""
    assert _wait_no_jobs(30) == []
    yield
    left = _our_jobs()
    if left:
        subprocess.run(["scancel", *left], timeout=30)
        _wait_no_jobs(30)


def _grpo_args(tiny_model_dir: Path, data: Path, run_dir: Path, job_name: str, steps: int) -> list[str]:
    return [
        f"model.path={tiny_model_dir}", f"data.train_files={data}", f"trainer.run_dir={run_dir}",
        f"trainer.total_training_steps={steps}", "trainer.progress=false",
        "data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=8",
        "rollout.data_parallel_size=1", "actor.data_parallel_size=2", "ref.data_parallel_size=1",  # 4 ranks
        f"cluster.slurm.job_name={job_name}", "cluster.slurm.memory=2GB", "cluster.startup_timeout_s=300",
        "cluster.timeout_s=300",
    ]


def test_grpo_with_every_worker_a_slurm_job(tmp_path, tiny_model_dir, addition_data):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "flowrl.cli", "submit", str(REPO / "cluster" / "slurm.yaml"),
           *_grpo_args(tiny_model_dir, addition_data[0], run_dir, f"{PREFIX}grpo", steps=2)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "done: 2 steps" in proc.stdout
    assert "flowrl: Dask dashboard at http://127.0.0.1:" in proc.stderr
    assert "flowrl: 5 SLURM jobs named flowrltestgrpo-" in proc.stderr  # 4 ranks + the controller
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert 0.0 <= row["critic/score/mean"] <= 1.0 and "actor/pg_loss" in row and "timing_s/step" in row
    # the workers really ran inside SLURM jobs: each job wrote its log under <run_dir>/slurm
    assert len(list((run_dir / "slurm").glob("flowrltestgrpo-*-*.err"))) == 5
    assert _wait_no_jobs(30) == [], "jobs left in squeue after the run"


@pytest.mark.parametrize("sig, within_s", [(signal.SIGTERM, 30), (signal.SIGINT, 120)], ids=["SIGTERM", "Ctrl-C"])
def test_client_killed_by_a_signal_leaves_no_jobs(tmp_path, tiny_model_dir, addition_data, sig, within_s):
    """SIGTERM: the handler cancels the jobs at once; Ctrl-C: the run closes (groups torn down,
    then the jobs cancelled) on its way out."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "flowrl.cli", "submit", str(REPO / "cluster" / "slurm.yaml"),
           *_grpo_args(tiny_model_dir, addition_data[0], run_dir, f"{PREFIX}sig", steps=1000)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    seen = threading.Event()
    lines: list[str] = []

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if "SLURM jobs named" in line:
                seen.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert seen.wait(300), "".join(lines)[-3000:]
        while len(_our_jobs()) < 5 and proc.poll() is None:  # all five jobs queued and running
            time.sleep(0.2)
        assert proc.poll() is None, "".join(lines)[-3000:]
        proc.send_signal(sig)
        start = time.monotonic()
        left = _wait_no_jobs(within_s)
        gone_s = time.monotonic() - start
        assert left == [], f"jobs {left} still queued {within_s}s after the client got {sig.name}"
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    print(f"jobs gone {gone_s:.1f}s after {sig.name}")


def test_slurm_cluster_listens_only_on_loopback(tmp_path):
    import psutil

    from flowrl.cluster import resolve_pools, start_cluster
    from flowrl.config import load_config

    cfg = load_config(None, [f"cluster.spec={REPO / 'cluster' / 'slurm.yaml'}", f"cluster.slurm.job_name={PREFIX}net",
                             "cluster.slurm.memory=1GB", "cluster.startup_timeout_s=300"]).cluster
    handle = start_cluster(cfg, resolve_pools(cfg, {"actor": 1}), log_dir=tmp_path)
    try:
        client = handle.client
        assert client.scheduler.address.startswith("tls://127.0.0.1:")  # mutual TLS by default
        assert handle.dashboard_link.startswith("http://127.0.0.1:")
        info = client.scheduler_info(n_workers=-1)["workers"]
        assert len(info) == 2 and all(a.startswith("tls://127.0.0.1:") for a in info)
        # the jobs got their credentials in the environment: no --tls-* files on their command line
        assert "--tls-" not in handle.cluster.job_script() and "--protocol tls://" in handle.cluster.job_script()
        assert not [p for p in tmp_path.rglob("*") if "dask-jobqueue" in p.name], "credential files written"
        assert sorted(r for w in info.values() for r in w["resources"]) == ["actor_rollout_ref", "flowrl-controller"]
        pids = set(client.run(os.getpid).values()) | set(client.run(os.getpid, nanny=True).values())
        processes = [psutil.Process()] + [psutil.Process(p) for p in pids]
        listening = [(p.pid, c.laddr) for p in processes for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert len(listening) >= 2 * 2 + 2  # workers, nannies, scheduler, dashboard
        exposed = [(pid, a) for pid, a in listening if not ipaddress.ip_address(a.ip).is_loopback]
        assert not exposed, f"listening beyond loopback: {exposed}"
        assert len(_our_jobs()) == 2
    finally:
        client.close()
        handle.close()
    assert _our_jobs() == []  # close() waits until squeue drops them


def test_startup_timeout_fails_clearly_and_cancels_the_jobs(tmp_path):
    from flowrl.cluster import resolve_pools, start_cluster
    from flowrl.config import load_config

    cfg = load_config(None, ["cluster.kind=slurm", f"cluster.slurm.job_name={PREFIX}slow", "cluster.slurm.memory=1GB",
                             "cluster.startup_timeout_s=0.5"]).cluster
    with pytest.raises(TimeoutError, match=r"of 3 slurm workers joined within cluster.startup_timeout_s=0s") as info:
        start_cluster(cfg, resolve_pools(cfg, {"actor": 2}), log_dir=tmp_path)
    assert "SLURM jobs (id state reason)" in str(info.value) and "fix:" in str(info.value)
    assert _our_jobs() == []  # the error path cancelled them


def test_slurm_notebook_executes(tmp_path, tiny_model_dir, addition_data, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    path = REPO / "notebooks" / "slurm.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["flowrl"]["requires"] == ["slurm"]
    monkeypatch.setenv("FLOWRL_NB_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("FLOWRL_NB_DATA", str(addition_data[0]))
    monkeypatch.setenv("FLOWRL_NB_RUN_DIR", str(tmp_path / "run"))
    for cell in nb.cells:  # name the notebook's jobs so the fixture can account for them
        if cell.cell_type == "code":
            cell.source = cell.source.replace("job_name=flowrlnb", f"job_name={PREFIX}nb")
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    # what every notebook must show (tests/dist/test_notebooks.py runs the others; this one only here)
    outputs = check_outputs(path, nb, tmp_path / "run")
    text = json.dumps(outputs)
    assert "critic/score/mean" in text and "jobs left: none" in text
    assert _wait_no_jobs(30) == []

"""The listener audit of a real run (issue 39): after a step of a tiny run (the default
placement; joint groups' FileStore: tests/unit/test_joint_group.py), every listening socket of
its processes is on the loopback, none answers HTTP (``cluster.dashboard=false``: no scheduler or worker HTTP server),
the Dask ports refuse a client without the run's credentials, the rendezvous ports reserved for
the groups' stores are not listening (FileStores in the run's private directory), the run's
temporary directory is private, and the run's outputs follow ``trainer.file_mode``. With the dashboard asked for, it is on the
loopback and refuses a websocket from a foreign ``Origin``."""

from __future__ import annotations

import os
import socket
import stat
import tempfile

import psutil
import pytest

from flowrl.config import load_config

pytestmark = pytest.mark.timeout(900)  # a run's workers and a model load: minutes on a loaded machine


def _listeners(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of ``pids``."""
    out = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            out.append((conn.pid, conn.laddr.ip, conn.laddr.port))
    return out


def _answers_http(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.settimeout(2)
        sock.sendall(b"GET /info/main/workers.html HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            return sock.recv(64)
        except (TimeoutError, OSError):
            return b""


def _dask_refuses_plain_client(address: str) -> bool:
    """Whether a Dask client without the run's certificate (plain tcp) is refused."""
    import asyncio

    from distributed.comm import connect

    async def attempt() -> None:
        comm = await connect(address.replace("tls://", "tcp://"), timeout=3)
        await comm.write({"op": "identity"})
        await asyncio.wait_for(comm.read(), 3)
        await comm.close()

    try:
        asyncio.run(asyncio.wait_for(attempt(), 8))
    except Exception:  # noqa: BLE001 - refused, closed or timed out: no answer without credentials
        return True
    return False


def _audit(session, seen: dict) -> None:
    from flowrl.comm import store

    me = psutil.Process()
    pids = {me.pid} | {p.pid for p in me.children(recursive=True)}
    seen["listeners"] = _listeners(pids)
    info = session.client.scheduler_info(n_workers=-1)
    seen["services"] = [info.get("services", {})] + [w.get("services", {}) for w in info["workers"].values()]
    seen["dask"] = [info["address"]] + list(info["workers"])
    seen["held"] = session.client.run(lambda: [s.getsockname()[1] for s in store._HELD])
    seen["http"] = {port: _answers_http(port) for _, _, port in seen["listeners"]}
    seen["plain"] = {a: _dask_refuses_plain_client(a) for a in seen["dask"][:2]}
    seen["tmp"] = tempfile.gettempdir()


@pytest.fixture(scope="module")
def audited(tiny_model_dir, addition_data, tmp_path_factory):
    from flowrl.run import Run, resolve_inputs

    run_dir = tmp_path_factory.mktemp("listeners") / "run"
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", "trainer.total_training_steps=1",
        f"trainer.run_dir={run_dir}", "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4",
        "trainer.file_mode=group",
    ])
    seen: dict = {}
    old = os.umask(0o022)
    run = Run.open(resolve_inputs(cfg))
    try:
        run.step()
        _audit(run.session, seen)
        run.save_checkpoint()
    finally:
        run.close()
        os.umask(old)
    return run_dir, seen


def test_every_listener_is_on_the_loopback_and_none_serves_http(audited):
    _, seen = audited
    assert seen["listeners"], "the run's processes listen on nothing? (psutil sees no socket)"
    assert all(ip in ("127.0.0.1", "::1") for _, ip, _ in seen["listeners"]), seen["listeners"]
    assert all("dashboard" not in s for s in seen["services"]), seen["services"]
    answered = {port: reply for port, reply in seen["http"].items() if reply.startswith(b"HTTP")}
    assert not answered, f"HTTP answered without credentials: {answered}"
    assert all(seen["plain"].values()), seen["plain"]  # mutual TLS: a client without the run's certificate is refused


def test_the_rendezvous_is_no_tcp_listener(audited):
    _, seen = audited
    held = sorted(p for ports in seen["held"].values() for p in ports)
    assert held, "no group rendezvoused through a FileStore"
    listening = {port for _, _, port in seen["listeners"]}
    assert not set(held) & listening


def test_temporary_files_and_outputs_are_private(audited):
    run_dir, seen = audited
    assert os.path.basename(seen["tmp"]).startswith("flowrl-run-")
    assert not os.path.exists(seen["tmp"]) or not stat.S_IMODE(os.stat(seen["tmp"]).st_mode) & 0o077
    wrong, exact = [], []
    for dirpath, dirnames, filenames in os.walk(run_dir):
        for names, mode in ((dirnames, 0o750), (filenames, 0o640)):
            for name in names:
                path = os.path.join(dirpath, name)
                have = stat.S_IMODE(os.lstat(path).st_mode)
                if have & ~mode:  # a bit beyond the policy (Dask's own mkdtemp folders are 0700: fewer)
                    wrong.append((path, oct(have)))
                if "dask-scratch" not in path:
                    exact.append(have == mode)
    assert (run_dir / "checkpoints").is_dir() and (run_dir / "experience").is_dir()
    assert not wrong, wrong[:10]
    assert exact and all(exact)  # checkpoints, experience, metrics, config, logs: the group policy itself


def test_the_dashboard_when_asked_is_on_the_loopback_and_checks_websocket_origins():
    import asyncio

    from distributed import Scheduler
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect

    from flowrl.cluster import listeners

    async def probe() -> tuple[str, dict[str, bool]]:
        with listeners.servers(True) as address:
            async with Scheduler(dashboard=True, dashboard_address=address) as scheduler:
                host, port = scheduler.http_server.address, scheduler.http_server.port
                accepted = {}
                for origin in (f"http://127.0.0.1:{port}", "http://evil.example", f"http://10.0.0.1:{port}"):
                    request = HTTPRequest(f"ws://127.0.0.1:{port}/status/ws", headers={"Origin": origin})
                    try:
                        conn = await asyncio.wait_for(websocket_connect(request), 10)
                        conn.close()
                        accepted[origin] = True
                    except HTTPClientError:
                        accepted[origin] = False
                return host, accepted

    host, accepted = asyncio.run(asyncio.wait_for(probe(), 60))
    assert host == "127.0.0.1"
    assert list(accepted.values()) == [True, False, False], accepted

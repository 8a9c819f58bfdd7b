"""Joint process groups (flowrl.comm.joint): built once per name, misuse named clearly."""

from __future__ import annotations

import pytest

from flowrl.comm import joint
from flowrl.comm.joint import JointSpec


def test_join_once_per_name_and_clear_errors():
    pytest.importorskip("torch")
    from flowrl.comm import free_port

    spec = JointSpec("unit-joint", "127.0.0.1", free_port(), 1, 30.0)
    try:
        pg = joint.join(spec, 0)  # a one-process group: the rendezvous completes at once
        assert joint.join(spec, 0) is pg and joint.get("unit-joint") is pg
        assert pg.size() == 1 and pg.rank() == 0
        with pytest.raises(ValueError, match="joined as rank 0 of 1, now asked for rank 1 of 2"):
            joint.join(JointSpec("unit-joint", "127.0.0.1", 0, 2), 1)
        with pytest.raises(ValueError, match="rank 3 is outside"):
            joint.join(JointSpec("other", "127.0.0.1", 0, 2), 3)
    finally:
        joint.close_all()
    with pytest.raises(KeyError, match="not joined here"):
        joint.get("unit-joint")


def test_a_joint_group_on_this_machine_meets_on_a_file_store_not_a_port(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import os

    import psutil

    from flowrl.comm import reserve_port, store

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("FLOWRL_PRIVATE_DIR", str(private))
    port = reserve_port("127.0.0.1")  # rank 0's reservation: bound, never listening
    try:
        pg = joint.join(JointSpec("unit-file", "127.0.0.1", port, 1, 30.0), 0)
        assert pg.size() == 1
        listening = {c.laddr.port for c in psutil.Process(os.getpid()).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN}
        assert port not in listening and port in [s.getsockname()[1] for s in store._HELD]
    finally:
        joint.close_all()
    monkeypatch.setenv("FLOWRL_PRIVATE_DIR", str(tmp_path))  # not 0700: no file there, a TCPStore
    os.chmod(tmp_path, 0o755)
    assert store._private_dir("127.0.0.1") is None and store._private_dir("10.0.0.1") is None


def test_a_released_reservation_frees_the_port_for_a_server_that_binds_it_itself():
    """``release_port``: what vLLM's weight-transfer rendezvous needs (it binds the port itself)."""
    import socket

    from flowrl.comm import store

    port = store.reserve_port("127.0.0.1")
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))  # held by the reservation
    store.release_port("127.0.0.1", port)
    assert ("127.0.0.1", port) not in store._RESERVED
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))  # the library's own server gets it
        server.listen(1)
    store.release_port("127.0.0.1", port)  # not reserved any more: nothing

"""Worker groups on a real LocalCluster: gloo groups, ordering, dispatch modes, failures, shutdown."""

import os
import time

import psutil
import pyarrow as pa
import pytest

from flowrl.actors import Gather, GroupCallError, GroupLostError, GroupMesh, Scatter, Session

ECHO = "flowrl_testing.roles:EchoRole"


@pytest.fixture(scope="module")
def session():
    s = Session.start(3, timeout_s=60, startup_timeout_s=120)
    yield s
    s.close()


@pytest.fixture(scope="module")
def echo(session):
    return session.create_group("echo", ECHO, {"tag": "t"}, mesh=GroupMesh(dp=2))


def test_one_rank_per_worker_process_and_a_real_gloo_group(session, echo):
    pids, _ = echo.run(echo.reserve(), "pid")
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert len(set(echo.addresses)) == 2
    # all_reduce of (1 + rank) over ranks 0, 1 = 1 + 2 = 3 on every rank
    values, _ = echo.run(echo.reserve(), "all_reduce", 1.0)
    assert values == [3.0, 3.0]


def test_split_dispatch_and_concat(echo):
    table = pa.table({"x": list(range(5))})
    out, seconds = echo.run(echo.reserve(), "rows", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT)
    assert out.column("x").to_pylist() == [0, 1, 2, 3, 4]
    assert out.column("rank").to_pylist() == [0, 0, 1, 1, 1]
    assert seconds >= 0


def test_calls_run_in_reserved_order_whatever_order_they_arrive(echo):
    first, second = echo.reserve(), echo.reserve()
    late = [a.call(second, "record", ("second",), {}, 30) for a in echo.actors]
    early = [a.call(first, "record", ("first", 0.3), {}, 30) for a in echo.actors]
    logs = [f.result(30)[0] for f in late]
    for log in logs:
        assert log[-2:] == ["first", "second"]
    assert all(f.result(30) for f in early)


def test_an_error_names_the_rank_and_the_group_stays_usable(echo):
    # both ranks fail; the first error to arrive is raised, naming its rank
    with pytest.raises(GroupCallError, match=r"echo.fail: rank (\d) on tls://\S+ raised ValueError: rank \1 failed on purpose"):
        echo.run(echo.reserve(), "fail")
    values, _ = echo.run(echo.reserve(), "all_reduce", 0.0)
    assert values == [1.0, 1.0]


def test_a_skipped_sequence_number_times_out_instead_of_hanging(echo):
    echo.reserve()  # reserved but never sent
    start = time.perf_counter()
    with pytest.raises((GroupCallError, TimeoutError), match="waited|did not answer"):
        echo.run(echo.reserve(), "pid", timeout=1.0)
    assert time.perf_counter() - start < 10


def test_group_larger_than_free_workers_is_refused(session):
    with pytest.raises(RuntimeError, match="free workers"):
        session.create_group("too_big", ECHO, mesh=GroupMesh(dp=5))


def test_lost_worker_is_reported_and_close_leaves_no_process():
    existing = {p.pid for p in _our_children()}  # the module's session, still open
    s = Session.start(1, timeout_s=30, startup_timeout_s=120)
    g = s.create_group("doomed", ECHO, mesh=GroupMesh(dp=1))
    assert {p.pid for p in _our_children()} - existing
    with pytest.raises(GroupLostError, match="doomed.exit_process: rank 0 .* was lost"):
        g.run(g.reserve(), "exit_process", timeout=20)
    s.close()
    deadline = time.time() + 20
    while {p.pid for p in _our_children()} - existing and time.time() < deadline:
        time.sleep(0.2)
    assert not {p.pid for p in _our_children()} - existing


def _our_children():
    """Live child processes, less multiprocessing's resource tracker (it exits with us)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out

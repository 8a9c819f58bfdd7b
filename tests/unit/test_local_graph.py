"""Graphs computed in the driver (``cluster.controller=driver``, ``flowrl.actors.local_graph``):
outputs resolve as their nodes finish, errors reach every pending output, graphs never starve
each other of threads; and where ``cluster.controller=auto`` puts them."""

from __future__ import annotations

import threading

import pytest
from dask import delayed

from flowrl.actors.local_graph import LocalGraphs
from flowrl.config import ConfigError, load_config

WAIT_S = 20


def _node(fn, *args, key):
    return delayed(fn, pure=False)(*args, dask_key_name=key)


def test_an_output_resolves_when_its_node_ends_not_when_the_graph_does():
    graphs = LocalGraphs()
    release = threading.Event()
    try:
        root = _node(lambda: 2, key="root-1")
        fast = _node(lambda x: x + 1, root, key="fast-1")
        slow = _node(lambda x: x * 10 if release.wait(WAIT_S) else None, root, key="slow-1")
        f_fast, f_slow = graphs.submit([fast, slow])
        assert f_fast.result(timeout=WAIT_S) == 3
        assert not f_slow.done()  # the step's result does not wait for its weight sync
        release.set()
        assert f_slow.result(timeout=WAIT_S) == 20
    finally:
        release.set()
        graphs.close()


def test_a_failing_node_fails_the_outputs_still_pending_and_keeps_those_resolved():
    graphs = LocalGraphs()
    first_done = threading.Event()
    try:
        root = _node(lambda: 1, key="root-2")
        ok = _node(lambda x: x, root, key="ok-2")

        def fail(x):
            first_done.wait(WAIT_S)
            raise ValueError("reward function broke")

        bad = _node(fail, root, key="bad-2")
        after = _node(lambda x: x, bad, key="after-2")
        f_ok, f_after = graphs.submit([ok, after])
        assert f_ok.result(timeout=WAIT_S) == 1
        first_done.set()
        with pytest.raises(ValueError, match="reward function broke"):
            f_after.result(timeout=WAIT_S)
        assert f_ok.result(timeout=0) == 1
    finally:
        first_done.set()
        graphs.close()


def test_a_graph_waiting_for_a_later_submitted_one_does_not_take_its_threads():
    """Graph A's node waits for graph B's (as a rank runs calls in reserved order): with one node
    thread per graph, B still runs, because each graph has a pool of its own."""
    graphs = LocalGraphs(node_threads=1)
    b_ran = threading.Event()
    try:
        (f_a,) = graphs.submit([_node(lambda: b_ran.wait(WAIT_S), key="a-3")])
        (f_b,) = graphs.submit([_node(b_ran.set, key="b-3")])
        f_b.result(timeout=WAIT_S)
        assert f_a.result(timeout=WAIT_S) is True
    finally:
        b_ran.set()
        graphs.close()


def test_node_threads_are_reused_across_graphs():
    """A node pool (and its threads) serves the next graph: torch's per-thread set-up is paid once
    per thread, not per step."""
    graphs = LocalGraphs(node_threads=2)
    try:
        names = set()
        for i in range(10):
            (f,) = graphs.submit([_node(lambda: threading.current_thread().name, key=f"name-{i}")])
            names.add(f.result(timeout=WAIT_S))
        assert names <= {"flowrl-node0-0", "flowrl-node0-1"}, names
    finally:
        graphs.close()


def test_known_keys_stand_for_values_the_graph_refers_to():
    """A node argument that Dask sees as another key (a rank actor handle: ``WorkerGroup``
    names its actors by key) takes the value given for that key."""
    from dask._task_spec import Task, TaskRef

    class Handle:  # what the graph refers to by key, given to submit
        pass

    handle = Handle()
    out = _node(lambda: None, key="unused-4")
    task = Task("uses-4", lambda h: h, TaskRef("RankActor-abc"))
    out.dask.layers[out.key] = {"uses-4": task}  # a one-node graph whose argument is a bare key
    out._key = "uses-4"
    graphs = LocalGraphs()
    try:
        (f,) = graphs.submit([out], {"RankActor-abc": handle})
        assert f.result(timeout=WAIT_S) is handle
    finally:
        graphs.close()


def test_no_graph_runs_after_close():
    graphs = LocalGraphs()
    graphs.close()
    with pytest.raises(RuntimeError, match="closed"):
        graphs.submit([_node(lambda: 1, key="late-5")])


# --------------------------------------------------------------------------- cluster.controller=auto
def _cfg(*overrides):
    return load_config(None, list(overrides))


def test_auto_runs_graphs_in_the_driver_of_a_local_run():
    assert _cfg().graph_controller == "driver"
    assert _cfg("cluster.controller=worker").graph_controller == "worker"


def test_auto_keeps_the_controller_worker_where_graphs_feed_graphs_or_the_driver_is_far():
    ahead = ("trainer.staleness=1", "rollout.free_cache_engine=false")
    assert _cfg(*ahead).graph_controller == "worker"
    assert _cfg("cluster.kind=slurm").graph_controller == "worker"


def test_the_driver_controller_with_generation_ahead_is_refused_before_any_worker_starts():
    with pytest.raises(ConfigError) as err:
        _cfg("cluster.controller=driver", "trainer.staleness=1", "rollout.free_cache_engine=false")
    text = str(err.value)
    assert "cluster.controller" in text and "driver" in text and "trainer.staleness" in text

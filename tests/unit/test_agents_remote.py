"""The runner's remote path (tools run elsewhere, e.g. as Dask tasks): the same timeout and error
observations as on the rank, the state coming back by value, and a timed-out call cancelled.
Here the "elsewhere" is a thread pool; tests/dist/test_agent_dask.py runs real Dask tasks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

from flowrl.agents.loop import Trajectory, _observe
from flowrl.agents.parsers import ParsedTurn, ToolCall
from flowrl.agents.runner import KEEP_STATE, ToolRunner
from flowrl.agents.tools import resolve_tools

POOL = concurrent.futures.ThreadPoolExecutor(4)
SUBMITTED: list[concurrent.futures.Future] = []


def in_pool(tool, args, state, timeout_s):
    """A remote executor: runs the call in another thread, on a copy of the state (by value)."""
    import copy

    def run():
        mine = copy.deepcopy(state)
        return asyncio.run(tool.call(args, mine)), mine

    # a hung task never completes (no thread holds it here)
    future = concurrent.futures.Future() if tool.name == "dask_hangs" else POOL.submit(run)
    SUBMITTED.append(future)
    return future


TOOLS = ["calculator", "flowrl_testing.agents:Where", "flowrl_testing.agents:DaskRaises",
         "flowrl_testing.agents:DaskHangs"]


def runner(timeout_s=2.0):
    return ToolRunner(resolve_tools(TOOLS), timeout_s=timeout_s, max_chars=100, remote=in_pool,
                      remote_tools={"where", "dask_raises", "dask_hangs"})


def test_remote_calls_answer_fail_and_time_out_like_local_ones():
    r = runner()
    SUBMITTED.clear()
    start = time.monotonic()
    try:
        res = r.run([(ToolCall("where", {}), {"calls": 4}), (ToolCall("calculator", {"expression": "6*7"}), None),
                     (ToolCall("dask_raises", {}), None), (ToolCall("dask_hangs", {}), None)])
    finally:
        r.close()
    assert time.monotonic() - start < 10  # the hanging call is cut at 2 s
    assert [x.text for x in res] == ["here 5", "42", "error: RuntimeError: boom in the here",
                                     "error: tool 'dask_hangs' timed out after 2 s"]
    assert [x.error for x in res] == [None, None, "raised", "timeout"]
    assert res[0].state == {"calls": 5} and res[1].state is KEEP_STATE  # remote: the state by value
    assert SUBMITTED[-1].cancelled()  # the timed-out call's future (a Dask task: cancelled too)


def test_the_loop_writes_a_remote_calls_state_back_into_the_trajectory():
    r = runner()
    traj = Trajectory(state={"where": {"calls": 0}})
    try:
        for _ in range(3):
            (texts,) = _observe(r, [(traj, ParsedTurn(calls=[ToolCall("where", {})]))])
    finally:
        r.close()
    assert texts == ["here 3"] and traj.state["where"] == {"calls": 3} and traj.tool_calls == 3

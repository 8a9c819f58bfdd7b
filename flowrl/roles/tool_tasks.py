"""Tool calls as Dask tasks: heavy tools (``Tool.run_on = "dask"`` or ``rollout.multi_turn.dask_tools``)
run on a worker of the cluster the rollout rank lives in, not on the rank itself.

:func:`submit_tool_call` is the agent runner's ``remote`` executor
(:class:`flowrl.agents.runner.ToolRunner`): it submits :func:`run_tool_call` with the tool, the
call's arguments and the trajectory's state (all by pickle; a user's tool class must be importable
on the workers) and hands back a :class:`concurrent.futures.Future` of ``(answer, state after the
call)``. The runner waits on it with the tool timeout and turns every failure into an error
observation, as for calls run on the rank; a timed-out call's task is cancelled, and the task
itself stops the call at the same timeout (a tool that blocks its thread holds that worker thread
until it returns, as Dask cannot stop a running task).

The scheduler places each task on any worker with a free thread (the rollout ranks' actors run in
their workers' actor threads, so a rank's own worker may run tool tasks while it waits).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from typing import Any

__all__ = ["connect", "run_tool_call", "submit_tool_call"]

_WAITERS = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="flowrl-tool-task")
"""Threads that wait for the tool tasks' results (Dask's done-callbacks share one thread)."""


def run_tool_call(tool: Any, args: dict, state: Any, timeout_s: float) -> tuple[bool, Any, Any]:
    """Run one call of ``tool`` (in a Dask task): ``(True, its answer, the state after it)``, or
    ``(False, the exception it raised, state)``: a tool's failure is a value, so a model's bad
    calls do not fill the workers' logs with failed-task tracebacks."""
    try:
        return True, asyncio.run(asyncio.wait_for(tool.call(args, state), timeout_s)), state
    except Exception as exc:  # noqa: BLE001 - reported to the model by the runner
        return False, exc, state


def _client() -> Any:
    """The Dask client of this process's worker (a rollout rank's: the runner's event-loop thread
    is no task thread, so ``get_worker`` cannot see it), or the process's current client."""
    from distributed import Worker, get_client

    workers = [w for w in list(Worker._instances) if w.status.name == "running"]
    if len(workers) == 1:
        return workers[0]._get_client()
    try:
        return get_client()
    except ValueError as exc:
        raise RuntimeError("a tool set to run as a Dask task was called outside a Dask worker or client") from exc


def connect() -> None:
    """Open this worker's client now (at the rank's start), not on the first call, whose timeout
    would otherwise include the connection."""
    _client()


def submit_tool_call(tool: Any, args: dict, state: Any, timeout_s: float) -> concurrent.futures.Future:
    """Submit :func:`run_tool_call` as a task; a Future of its result, cancelling the task when
    it is itself cancelled (the runner's timeout)."""
    client = _client()
    task = client.submit(run_tool_call, tool, args, state, timeout_s, pure=False,
                         key=f"tool-{tool.name}-{uuid.uuid4().hex}")
    out: concurrent.futures.Future = concurrent.futures.Future()

    def wait() -> None:  # one waiting thread per call: a hung call holds up no other's result
        try:
            ok, value, state = task.result(timeout=timeout_s + 5.0)
        except BaseException as exc:  # a task Dask could not run, a cancelled or a late one: reported
            _settle(out, exception=exc)
        else:
            _settle(out, result=(value, state)) if ok else _settle(out, exception=value)

    def abandoned(fut: concurrent.futures.Future) -> None:
        if fut.cancelled():
            task.cancel()

    out.add_done_callback(abandoned)
    _WAITERS.submit(wait)
    return out


def _settle(out: concurrent.futures.Future, *, result: Any = None, exception: BaseException | None = None) -> None:
    try:
        if exception is not None:
            out.set_exception(exception)
        else:
            out.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass  # cancelled meanwhile: nobody waits for it

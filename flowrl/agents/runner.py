"""Running tool calls: concurrently on a private asyncio loop, each with a timeout, every
failure turned into an error observation.

The loop lives in a daemon thread, so a tool that blocks its event loop (synchronous code in an
``async def``) cannot block the rollout rank: the caller waits on each call's future with a
deadline, reports the stragglers as timed out and, since their loop is stuck, starts a fresh loop
for the next batch (the stuck thread is left to finish or to die with the process).

Tools in ``remote_tools`` go to ``remote(tool, args, state, timeout_s)``, which starts the call
elsewhere (the rollout role passes one that submits a Dask task, :mod:`flowrl.roles.tool_tasks`)
and returns a :class:`concurrent.futures.Future` of ``(text, state after the call)``: the same
timeout, and the same error observations, apply; a timed-out future is cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from flowrl.agents.parsers import ToolCall
from flowrl.agents.tools import Tool

__all__ = ["CallResult", "KEEP_STATE", "RemoteCall", "ToolRunner"]

KEEP_STATE: Any = object()
"""A :class:`CallResult`'s ``state`` when the call changed the trajectory's state in place."""

RemoteCall = Callable[[Tool, dict, Any, float], "concurrent.futures.Future[tuple[Any, Any]]"]


@dataclass(frozen=True)
class CallResult:
    text: str
    """The observation shown to the model."""
    error: str | None = None
    """Why the call failed (``raised``, ``timeout``, ``bad_return``, ``unknown_tool``), None if it ran."""
    state: Any = KEEP_STATE
    """The tool's state after a remote call (replaces the trajectory's), else :data:`KEEP_STATE`."""


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [truncated {len(text) - limit} characters]"


class ToolRunner:
    """Runs batches of calls on ``tools``; ``timeout_s`` each, observations cut at ``max_chars``."""

    def __init__(self, tools: dict[str, Tool], *, timeout_s: float, max_chars: int,
                 remote: RemoteCall | None = None, remote_tools: frozenset[str] | set[str] = frozenset()) -> None:
        self.tools, self.timeout_s, self.max_chars = tools, timeout_s, max_chars
        unknown = set(remote_tools) - set(tools)
        assert not unknown, f"remote tools {sorted(unknown)} are not among the tools"
        assert remote is not None or not remote_tools, "remote_tools need a remote executor"
        self.remote, self.remote_tools = remote, frozenset(remote_tools)
        self._loop: asyncio.AbstractEventLoop | None = None

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="flowrl-tools", daemon=True).start()
            self._loop = loop
        return self._loop

    async def _one(self, call: ToolCall, state: Any) -> CallResult:
        tool = self.tools.get(call.name)
        if tool is None:
            return CallResult(f"error: unknown tool {call.name!r}; available: {', '.join(sorted(self.tools))}",
                              "unknown_tool")
        new_state = KEEP_STATE
        try:
            if call.name in self.remote_tools:
                future = self.remote(tool, call.arguments, state, self.timeout_s)
                out, new_state = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
            else:
                out = await asyncio.wait_for(tool.call(call.arguments, state), self.timeout_s)
        except asyncio.TimeoutError:
            return CallResult(f"error: tool {call.name!r} timed out after {self.timeout_s:g} s", "timeout")
        except Exception as exc:  # a tool's own failure is an observation, never a failed step
            return CallResult(_truncate(f"error: {type(exc).__name__}: {exc}", self.max_chars), "raised")
        if not isinstance(out, str):
            return CallResult(f"error: tool {call.name!r} returned {type(out).__name__}, not text", "bad_return",
                              new_state)
        return CallResult(_truncate(out, self.max_chars), state=new_state)

    def run(self, calls: list[tuple[ToolCall, Any]]) -> list[CallResult]:
        """The results of ``(call, trajectory state)`` pairs, in order."""
        if not calls:
            return []
        loop = self._event_loop()
        futures = [asyncio.run_coroutine_threadsafe(self._one(c, s), loop) for c, s in calls]
        deadline = time.monotonic() + self.timeout_s + 1.0
        out = []
        for (call, _), fut in zip(calls, futures):
            try:
                out.append(fut.result(timeout=max(0.0, deadline - time.monotonic())))
            except concurrent.futures.TimeoutError:
                fut.cancel()
                self._loop = None  # its loop is blocked: the next batch gets a fresh one
                out.append(CallResult(f"error: tool {call.name!r} timed out after {self.timeout_s:g} s", "timeout"))
        return out

    def close(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None

"""The tool interface and the tool registry.

A tool is user code, registered by import string like a reward function. It has a ``name``, a JSON
``schema`` (the ``function`` object a chat template's ``tools`` list takes), an async
``call(args, state) -> str``, and optional per-trajectory state (``create_state(row)``) and a
reward hook (``reward(state) -> float``, added to the row's score times
``rollout.multi_turn.tool_reward_coef``) and a ``release(state)`` hook run once the trajectory is
over. The agent loop runs every call with a timeout; whatever a tool does wrong (raises, hangs,
returns something other than a string) becomes an error observation for the model and a counted
tool error, never a failed step.

Where a call runs: ``run_on = "rank"`` (the default) on the rollout rank's own asyncio loop;
``run_on = "dask"`` (or the tool's name in ``rollout.multi_turn.dask_tools``) as a Dask task on a
worker of the cluster, for heavy tools, with the same timeout and error handling. A Dask-run tool
and its state travel by pickle; the state the task ends with replaces the trajectory's.

Built-in tools: ``calculator`` (:mod:`flowrl.agents.calculator`) and ``python``
(:mod:`flowrl.agents.sandbox`). ``rollout.multi_turn.tools`` names them, or ``module:ClassName``.
"""

from __future__ import annotations

from typing import Any

from flowrl.registry import Registry

__all__ = ["TOOLS", "Tool", "resolve_tools"]


class Tool:
    """Base class of a tool; subclass it and set ``name`` and ``schema``, implement ``call``."""

    name: str = ""
    """The function name the model writes in a call."""
    schema: dict = {}
    """The tool's JSON schema: ``{"name", "description", "parameters": {...}}``."""
    run_on: str = "rank"
    """``rank``: calls run on the rollout rank's asyncio loop; ``dask``: as Dask tasks on the
    cluster's workers (heavy tools; see the module docstring)."""

    def create_state(self, row: dict) -> Any:
        """Per-trajectory state, from the prompt row (its columns); None by default."""
        return None

    async def call(self, args: dict, state: Any) -> str:
        """Run the call; the returned string is shown to the model as the tool's response."""
        raise NotImplementedError

    def reward(self, state: Any) -> float:
        """A reward from the trajectory's state once it is over: summed over the tools, times
        ``rollout.multi_turn.tool_reward_coef``, it is the row's ``tool_reward`` and is added to
        the reward function's score. 0 by default."""
        return 0.0

    def release(self, state: Any) -> None:
        """Free what ``create_state`` took (files, connections), after :meth:`reward`."""

    def chat_schema(self) -> dict:
        """The entry of the chat template's ``tools`` list."""
        return {"type": "function", "function": {"name": self.name, **{k: v for k, v in self.schema.items() if k != "name"}}}


TOOLS: Registry[type] = Registry("tool", allow_import_strings=True)
TOOLS.register("calculator", "flowrl.agents.calculator:Calculator")
TOOLS.register("python", "flowrl.agents.sandbox:PythonSandbox")


def resolve_tools(names: list[str] | tuple[str, ...], options: dict | None = None) -> dict[str, Tool]:
    """Tool instances by the name the model calls them, from registered names or import strings
    (with verl's tool config file too: :func:`flowrl.agents.verl_tools.resolve_all_tools`).

    ``options``: keyword arguments per registered name / import string (e.g. the sandbox's limits).
    """
    out: dict[str, Tool] = {}
    for entry in names:
        cls = TOOLS.get(entry)
        tool = cls(**(options or {}).get(entry, {})) if isinstance(cls, type) else cls
        if not isinstance(tool, Tool) and not callable(getattr(tool, "call", None)):
            raise TypeError(f"tool {entry!r} resolved to {tool!r}, which has no async call(args, state)")
        if not tool.name:
            raise ValueError(f"tool {entry!r} has an empty name; set the class attribute `name`")
        if tool.name in out:
            raise ValueError(f"two tools are called {tool.name!r}; tool names must be unique")
        out[tool.name] = tool
    return out

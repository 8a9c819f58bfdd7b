"""The gym-style environment interface, for multi-turn tasks without tool syntax.

An environment sees each model turn as an ``action`` (its text) and answers with an observation
(rendered like a tool answer, ``response_mask`` 0), a reward and whether the episode is over::

    class Guess(Environment):
        def reset(self, row):             # one environment per trajectory, from its prompt row
            self.secret = int(row["ground_truth"])
        def step(self, action):
            guess = int(action.strip() or 0)
            done = guess == self.secret
            return ("correct" if done else "higher" if guess < self.secret else "lower"), float(done), done

:func:`as_parser_and_tool` turns an environment factory into a parser and a tool for
:func:`flowrl.agents.loop.run_agent_loop` (every turn not ending the episode is one "call"), so an
environment runs through the same loop, budget, timeouts and masks as tools do. The summed rewards
are the tool's reward hook (``tool_reward``, added to the score like every tool's).

From the config: ``rollout.multi_turn.environment=my_mod:Guess`` (a subclass, or any callable
returning an environment, by import string or registered in :data:`ENVIRONMENTS`); it takes the
place of ``tools`` and ``parser``. The prompt row an environment's ``reset`` gets holds the row's
columns (``data_source``, ``ground_truth``, ``extra_info`` as JSON text, ...).
"""

from __future__ import annotations

from typing import Any, Callable

from flowrl.agents.parsers import ParsedTurn, ToolCall
from flowrl.agents.tools import Tool
from flowrl.registry import Registry

__all__ = ["ENVIRONMENTS", "Environment", "as_parser_and_tool", "resolve_environment"]

ENV_TOOL = "__env__"


class Environment:
    """One episode; subclass it and implement ``reset`` and ``step``."""

    def reset(self, row: dict) -> None:
        """Start an episode for the prompt ``row`` (its columns)."""

    def step(self, action: str) -> tuple[str, float, bool]:
        """``(observation, reward, done)`` for the model's turn ``action``."""
        raise NotImplementedError


class _EnvTool(Tool):
    name = ENV_TOOL

    def __init__(self, factory: Callable[[], Environment]) -> None:
        self.factory = factory

    def create_state(self, row: dict) -> dict:
        env = self.factory()
        env.reset(row)
        return {"env": env, "reward": 0.0, "done": False}

    async def call(self, args: dict, state: dict) -> str:
        observation, reward, done = state["env"].step(args["action"])
        state["reward"] += float(reward)
        state["done"] = bool(done)
        return str(observation)

    def reward(self, state: dict) -> float:
        return state["reward"]


def as_parser_and_tool(factory: Callable[[], Environment]) -> tuple[Callable[[str], ParsedTurn], Tool, Callable]:
    """``(parser, tool, ended)`` for :func:`~flowrl.agents.loop.run_agent_loop`: the parser makes
    every turn an environment step, the tool takes it, ``ended(trajectory)`` is the episode's
    ``done`` (the loop then stops without appending the last observation)."""
    tool = _EnvTool(factory)

    def parse(text: str) -> ParsedTurn:
        return ParsedTurn(calls=[ToolCall(ENV_TOOL, {"action": text})])

    def ended(traj: Any) -> bool:
        return bool(traj.state[ENV_TOOL]["done"])

    return parse, tool, ended


ENVIRONMENTS: Registry[Callable[[], Environment]] = Registry("environment", allow_import_strings=True)


def resolve_environment(name: str) -> Callable[[], Environment]:
    """The environment factory registered as ``name`` or named by ``module:Class``; TypeError
    if it is not an :class:`Environment` subclass or a callable."""
    factory = ENVIRONMENTS.get(name)
    if isinstance(factory, type) and not issubclass(factory, Environment):
        raise TypeError(f"environment {name!r} is the class {factory.__name__}, not a flowrl.agents.env.Environment")
    if not callable(factory):
        raise TypeError(f"environment {name!r} resolved to {factory!r}, which is not callable")
    return factory

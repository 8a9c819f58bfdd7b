"""What a rollout rank holds for multi-turn rollouts, built from ``rollout.multi_turn``: the chat
codec, the parser, the tools (or an environment) and their runner; it runs the agent loop on the
rank's engine and turns the trajectories into experience columns.

Tools or an environment:

* ``tools`` with a ``parser``: each turn's calls run on the tools (:mod:`flowrl.agents.runner`);
  those with ``run_on = "dask"`` or named in ``dask_tools`` go to the ``remote`` executor the role
  passes (Dask tasks on the cluster's workers);
* ``environment``: every turn is a step of a gym-style environment (:mod:`flowrl.agents.env`), one
  per trajectory, until it says ``done``.

The score rule (:func:`agent_columns`): ``tool_reward`` = ``tool_reward_coef`` x the sum of the
tools' ``reward(state)`` hooks (an environment's summed step rewards), computed when the trajectory
is over, after which each tool's ``release(state)`` runs; the reward node adds ``tool_reward`` to
the reward function's score (``flowrl.nodes.rewards.reward``). verl 0.9.1 differs: its
``ToolAgentLoop`` collects each ``execute`` call's reward as the sample's ``tool_rewards`` list,
which its default reward manager leaves out of the score (a reward function may read it); it calls
``release`` after every call and never calls ``calc_reward``. ``tool_reward_coef=0`` gives verl's
score.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pyarrow as pa

from flowrl.agents.loop import AgentSettings, ChatCodec, GenerateFn, Trajectory, run_agent_loop
from flowrl.agents.runner import RemoteCall, ToolRunner
from flowrl.agents.tools import Tool
from flowrl.data import experience

__all__ = ["AGENT_COLUMNS", "Agent", "agent_columns"]

AGENT_COLUMNS = ("num_turns", "tool_calls", "tool_errors", "malformed_calls", "finish_reason", "tool_reward",
                 "turn_spans")
"""Per-sample columns of multi-turn rollouts: model turns, tool calls (malformed ones included),
failed calls, unreadable calls, why the trajectory ended (``stop``, ``length``, ``max_turns``),
the tools' reward (see the module docstring), and ``[start, end, kind]`` per turn in
``response_ids`` (kind 1: the model's tokens, 0: a tool's or the environment's answer)."""


class Agent:
    """One rank's agent: ``cfg`` is a ``rollout.multi_turn`` section (enabled), ``tokenizer`` the
    model's; ``extra_eos_ids`` the generation config's EOS ids; ``remote`` runs Dask-bound tools,
    ``connect()`` prepares it (called once here when some tool needs it)."""

    def __init__(self, cfg: Any, tokenizer: Any, *, extra_eos_ids: Sequence[int] = (),
                 remote: RemoteCall | None = None, connect: Callable[[], None] | None = None) -> None:
        from flowrl.agents.env import as_parser_and_tool, resolve_environment
        from flowrl.agents.parsers import resolve_parser
        from flowrl.agents.verl_tools import resolve_all_tools

        self.cfg = cfg
        self.codec = ChatCodec(tokenizer, extra_eos_ids=extra_eos_ids)
        self.ended: Callable[[Trajectory], bool] | None = None
        if cfg.environment:
            self.parser, env_tool, self.ended = as_parser_and_tool(resolve_environment(cfg.environment))
            self.tools: dict[str, Tool] = {env_tool.name: env_tool}
        else:
            self.parser = resolve_parser(cfg.parser)
            self.tools = resolve_all_tools(cfg.tools, getattr(cfg, "tool_config_path", ""))
        on_dask = {n for n, t in self.tools.items() if n in cfg.dask_tools or getattr(t, "run_on", "rank") == "dask"}
        if on_dask and remote is None:
            raise RuntimeError(f"tools {sorted(on_dask)} run as Dask tasks, but this rank has no Dask executor")
        self.runner = ToolRunner(self.tools, timeout_s=cfg.tool_timeout_s, max_chars=cfg.max_tool_response_chars,
                                 remote=remote, remote_tools=on_dask)
        if on_dask and connect is not None:
            connect()

    def settings(self, response_length: int) -> AgentSettings:
        return AgentSettings(max_turns=self.cfg.max_turns, response_length=response_length,
                             tool_timeout_s=self.cfg.tool_timeout_s,
                             max_observation_chars=self.cfg.max_tool_response_chars)

    def states(self, row: dict) -> dict:
        """Tool name -> its state for the trajectory of prompt ``row``."""
        return {name: tool.create_state(row) for name, tool in self.tools.items()}

    def run(self, prompt_ids: list[list[int]], rows: list[dict], *, generate: GenerateFn, response_length: int,
            seed: int) -> list[Trajectory]:
        """One trajectory per prompt (``rows``: each prompt's columns, for the tools' states)."""
        return run_agent_loop(prompt_ids, generate=generate, codec=self.codec, parser=self.parser,
                              runner=self.runner, settings=self.settings(response_length), seed=seed,
                              states=[self.states(row) for row in rows], ended=self.ended)

    def columns(self, trajs: list[Trajectory]) -> dict[str, pa.Array]:
        """:func:`agent_columns` with this agent's tools and ``tool_reward_coef``."""
        return agent_columns(trajs, self.tools, tool_reward_coef=self.cfg.tool_reward_coef)

    def close(self) -> None:
        self.runner.close()


def agent_columns(trajs: list[Trajectory], tools: dict[str, Tool], *, tool_reward_coef: float = 1.0) -> dict[str, pa.Array]:
    """The experience columns of finished trajectories (response, mask, log-probs,
    :data:`AGENT_COLUMNS`); runs each tool's ``reward`` then ``release`` on each trajectory's state."""
    def ints(values: list[int]) -> pa.Array:
        return pa.array(values, pa.int32())

    rewards = []
    for t in trajs:
        rewards.append(tool_reward_coef * float(sum(tool.reward(t.state.get(name)) for name, tool in tools.items())))
        for name, tool in tools.items():
            release = getattr(tool, "release", None)
            if release is not None:
                release(t.state.get(name))
    return dict(
        response_ids=experience.from_lists([t.response for t in trajs], experience.TOKEN_IDS),
        response_mask=experience.from_lists([t.mask for t in trajs], pa.list_(pa.int8())),
        rollout_logprobs=experience.from_lists([t.logprobs for t in trajs], experience.TOKEN_FLOATS),
        num_turns=ints([t.num_turns for t in trajs]),
        tool_calls=ints([t.tool_calls for t in trajs]),
        tool_errors=ints([t.tool_errors for t in trajs]),
        malformed_calls=ints([t.malformed_calls for t in trajs]),
        finish_reason=pa.array([t.finish_reason for t in trajs], pa.string()),
        tool_reward=pa.array(rewards, pa.float32()),
        turn_spans=pa.array([t.spans for t in trajs], pa.list_(pa.list_(pa.int32()))),
    )

"""``rollout.multi_turn``: tool-using, multi-turn rollouts (:mod:`flowrl.agents`).

Off by default; with ``enable=false`` nothing about generation changes. Tool, parser and
environment names are resolved here, so a typo or an import error is a
:class:`~flowrl.config.ConfigError` before any worker starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from flowrl.config.errors import ConfigError, check, check_positive


@dataclass(kw_only=True)
class MultiTurnConfig:
    enable: bool = False
    """Run the agent loop: generate until EOS, run the tool calls of the turn, append their
    answers (``response_mask`` 0), repeat; ``rollout.response_length`` counts all turns."""
    max_turns: int = 4
    """Model turns per trajectory at most (the calls of the last turn are not run)."""
    parser: str = "hermes"
    """Tool-call parser: ``hermes`` (``<tool_call>{json}</tool_call>``, Qwen's format) or
    ``module:function`` (``fn(text) -> flowrl.agents.parsers.ParsedTurn``)."""
    tools: list[str] = field(default_factory=list)
    """Tools the model may call: built-in ``calculator``, ``python`` (runs the code in a jail: ``sandbox.*``), or
    ``module:ToolClass`` (a ``flowrl.agents.tools.Tool``). Their schemas go into the chat
    template's ``tools`` when prompts are rendered (templates without tool support ignore them)."""
    tool_config_path: str = ""
    """verl's tool config (a YAML file of ``tools: [{class_name, config, tool_schema}]``): its tools
    join ``tools`` (:mod:`flowrl.agents.verl_tools`: verl's Gsm8kTool, or flowrl Tool classes);
    a file that is not there yet is checked at the start of the run."""
    environment: str = ""
    """A gym-style environment instead of tools: ``module:Class`` (a
    ``flowrl.agents.env.Environment``: ``reset(row)``, ``step(action) -> observation, reward,
    done``); every model turn is a step until ``done``. Excludes ``tools``."""
    dask_tools: list[str] = field(default_factory=list)
    """Tools (by the name the model calls them) whose calls run as Dask tasks on the cluster's
    workers rather than on the rollout rank (heavy tools); a tool class may also set
    ``run_on = "dask"``. Same timeout and error handling."""
    tool_timeout_s: float = 10.0
    """Wall-clock limit of one tool call; a call past it answers with a timeout error."""
    max_tool_response_chars: int = 1000
    """A tool's answer is cut to this many characters before it is shown to the model."""
    tool_reward_coef: float = 1.0
    """``score = reward function's score + tool_reward_coef x sum of the tools' reward(state)``
    (an environment's summed step rewards); 0 leaves the tools' rewards out, as verl's default
    reward manager does."""

    def __post_init__(self) -> None:
        check_positive("max_turns", self.max_turns, "use e.g. 4")
        check_positive("tool_timeout_s", self.tool_timeout_s, "use e.g. 10")
        check_positive("max_tool_response_chars", self.max_tool_response_chars, "use e.g. 1000")
        check(math.isfinite(self.tool_reward_coef), "tool_reward_coef", self.tool_reward_coef,
              "must be a finite number", "use e.g. 1.0, or 0 to leave tool rewards out of the score")
        if not self.enable:
            return
        if self.environment:
            self._check_environment()
        else:
            self._check_tools()

    def _check_environment(self) -> None:
        from flowrl.agents.env import resolve_environment

        check(not self.tools, "environment", self.environment, "is set together with rollout.multi_turn.tools",
              "use either tools or an environment, e.g. drop rollout.multi_turn.tools")
        check(not self.dask_tools, "dask_tools", self.dask_tools, "names tools while an environment is set",
              "drop rollout.multi_turn.dask_tools")
        try:
            resolve_environment(self.environment)
        except (ValueError, TypeError) as exc:
            raise ConfigError("environment", self.environment, str(exc),
                              "name a flowrl.agents.env.Environment subclass as 'module:Class'") from None

    def _check_tools(self) -> None:
        from flowrl.agents.parsers import resolve_parser

        check(bool(self.tools) or bool(self.tool_config_path), "tools", self.tools,
              "is empty while multi_turn.enable=true: a multi-turn rollout "
              "without a tool or an environment is not built in flowrl",
              "name at least one tool, e.g. rollout.multi_turn.tools=[calculator], or set "
              "rollout.multi_turn.environment=module:Class")
        try:
            resolve_parser(self.parser)
        except (ValueError, TypeError) as exc:
            raise ConfigError("parser", self.parser, str(exc), "use hermes or a 'module:function' parser") from None
        names = self._tool_names()
        unknown = [t for t in self.dask_tools if t not in names]
        check(not unknown, "dask_tools", self.dask_tools, f"names {unknown}, which are not among the tools {names}",
              "list names of rollout.multi_turn.tools (as the model calls them)")

    def _tool_names(self) -> list[str]:
        from pathlib import Path

        from flowrl.agents.verl_tools import resolve_all_tools

        # a verl tool config that is not there yet is checked at the start of the run (check_tool_config)
        path = self.tool_config_path if self.tool_config_path and Path(self.tool_config_path).is_file() else ""
        try:
            later = list(self.dask_tools) if self.tool_config_path and not path else []
            return list(resolve_all_tools(self.tools, path)) + later
        except (ValueError, TypeError, OSError) as exc:
            if path:
                raise ConfigError("tool_config_path", path, str(exc), "fix the tool config, or drop it") from None
            raise ConfigError("tools", self.tools, str(exc),
                              "use calculator, python or a 'module:ToolClass' import string") from None

    def chat_tools(self) -> list[dict] | None:
        """The tools' entries for the chat template's ``tools`` argument (OpenAI function
        format, as verl and transformers take them); None when off or with an environment."""
        if not self.enable or self.environment or not (self.tools or self.tool_config_path):
            return None
        from flowrl.agents.verl_tools import resolve_all_tools

        tools = resolve_all_tools(self.tools, self.tool_config_path)
        return [tool.chat_schema() for tool in tools.values()]

"""``rollout.multi_turn``: tool-using, multi-turn rollouts (:mod:`flowrl.agents`).

Off by default; with ``enable=false`` nothing about generation changes. Tool and parser names are
resolved here, so a typo or an import error is a :class:`~flowrl.config.ConfigError` before any
worker starts.
"""

from __future__ import annotations

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
    """Tools the model may call: built-in ``calculator``, ``python`` (a sandboxed subprocess), or
    ``module:ToolClass`` (a ``flowrl.agents.tools.Tool``)."""
    tool_timeout_s: float = 10.0
    """Wall-clock limit of one tool call; a call past it answers with a timeout error."""
    max_tool_response_chars: int = 1000
    """A tool's answer is cut to this many characters before it is shown to the model."""

    def __post_init__(self) -> None:
        check_positive("max_turns", self.max_turns, "use e.g. 4")
        check_positive("tool_timeout_s", self.tool_timeout_s, "use e.g. 10")
        check_positive("max_tool_response_chars", self.max_tool_response_chars, "use e.g. 1000")
        if not self.enable:
            return
        check(bool(self.tools), "tools", self.tools, "is empty while multi_turn.enable=true",
              "name at least one tool, e.g. rollout.multi_turn.tools=[calculator]")
        from flowrl.agents.parsers import resolve_parser
        from flowrl.agents.tools import resolve_tools

        try:
            resolve_parser(self.parser)
        except (ValueError, TypeError) as exc:
            raise ConfigError("parser", self.parser, str(exc), "use hermes or a 'module:function' parser") from None
        try:
            resolve_tools(self.tools)
        except (ValueError, TypeError) as exc:
            raise ConfigError("tools", self.tools, str(exc),
                              "use calculator, python or a 'module:ToolClass' import string") from None

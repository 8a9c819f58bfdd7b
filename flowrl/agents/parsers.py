"""Tool-call parsers: the text of one model turn -> the calls it makes and the malformed ones.

A parser is ``fn(text) -> ParsedTurn``, registered in :data:`PARSERS` or named by import string
(``rollout.multi_turn.parser=my_mod:parse``). Built in: ``hermes`` (Hermes / Qwen2.5 style, the
format of Qwen's chat template)::

    <tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>

A turn may hold several calls; each that is not a JSON object with a string ``name`` and an object
``arguments`` (a JSON string of one is accepted, as some models write) is counted as malformed
and answered with an error observation. An opened ``<tool_call>`` that never closes is malformed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable

from flowrl.registry import Registry

__all__ = ["PARSERS", "ParsedTurn", "ToolCall", "hermes", "resolve_parser"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass
class ParsedTurn:
    calls: list[ToolCall] = field(default_factory=list)
    """Well-formed calls, in the order written."""
    errors: list[str] = field(default_factory=list)
    """One message per malformed call (shown to the model as an error observation)."""

    @property
    def has_calls(self) -> bool:
        return bool(self.calls or self.errors)


Parser = Callable[[str], ParsedTurn]
PARSERS: Registry[Parser] = Registry("tool-call parser", allow_import_strings=True)

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _hermes_call(body: str) -> ToolCall | str:
    """A call from the JSON body of one block, or the error message."""
    try:
        obj = json.loads(body)
    except ValueError as exc:
        return f"malformed tool call: invalid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return 'malformed tool call: expected {"name": <string>, "arguments": {...}}'
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return "malformed tool call: arguments is a string that is not JSON"
    if not isinstance(args, dict):
        return "malformed tool call: arguments must be a JSON object"
    return ToolCall(obj["name"], args)


@PARSERS.register("hermes")
def hermes(text: str) -> ParsedTurn:
    """Every ``<tool_call>{json}</tool_call>`` block of ``text``; see the module docstring."""
    out = ParsedTurn()
    end = 0
    for match in _HERMES_BLOCK.finditer(text):
        end = match.end()
        call = _hermes_call(match.group(1).strip())
        (out.errors if isinstance(call, str) else out.calls).append(call)
    if "<tool_call>" in text[end:]:
        out.errors.append("malformed tool call: <tool_call> is never closed by </tool_call>")
    return out


def resolve_parser(name: str) -> Parser:
    """The parser registered as ``name``, or the function a ``module:function`` names."""
    fn = PARSERS.get(name)
    if not callable(fn):
        raise TypeError(f"tool-call parser {name!r} resolved to {fn!r}, which is not callable")
    return fn

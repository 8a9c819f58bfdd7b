"""The hermes tool-call parser and the tool registry: well-formed calls, and each malformed kind."""

from __future__ import annotations

import pytest

from flowrl.agents.parsers import PARSERS, ToolCall, hermes, resolve_parser
from flowrl.agents.tools import resolve_tools


def test_one_call_and_text_around_it():
    turn = hermes('let me compute <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>')
    assert turn.calls == [ToolCall("calculator", {"expression": "2*3"})] and turn.errors == []


def test_two_calls_in_order_and_arguments_as_a_json_string():
    turn = hermes('<tool_call>{"name":"a","arguments":{}}</tool_call>\n'
                  '<tool_call>{"name":"b","arguments":"{\\"x\\": 1}"}</tool_call>')
    assert turn.calls == [ToolCall("a", {}), ToolCall("b", {"x": 1})]


def test_no_call_is_not_a_call():
    assert not hermes("the answer is 42").has_calls
    assert not hermes("").has_calls


@pytest.mark.parametrize("text,fragment", [
    ('<tool_call>{"name": "a", "arguments": {</tool_call>', "invalid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "expected"),
    ('<tool_call>{"arguments": {}}</tool_call>', "expected"),
    ('<tool_call>{"name": 3}</tool_call>', "expected"),
    ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "a", "arguments": "not json"}</tool_call>', "not JSON"),
    ('<tool_call>{"name": "a", "arguments": {}}', "never closed"),
])
def test_malformed_calls_are_errors_not_calls(text, fragment):
    turn = hermes(text)
    assert turn.calls == [] and len(turn.errors) == 1 and fragment in turn.errors[0]
    assert turn.has_calls  # answered with an error observation, the trajectory goes on


def test_a_good_call_next_to_a_bad_one():
    turn = hermes('<tool_call>{"name":"a","arguments":{}}</tool_call><tool_call>oops</tool_call>')
    assert turn.calls == [ToolCall("a", {})] and len(turn.errors) == 1


def test_parsers_resolve_by_name_and_import_string():
    assert resolve_parser("hermes") is hermes
    assert resolve_parser("flowrl.agents.parsers:hermes") is hermes
    assert "hermes" in PARSERS.names()
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        resolve_parser("nope")


def test_tools_resolve_by_name_and_import_string():
    tools = resolve_tools(["calculator", "flowrl.agents.sandbox:PythonSandbox"])
    assert sorted(tools) == ["calculator", "python"]
    with pytest.raises(ValueError, match="unique"):
        resolve_tools(["calculator", "flowrl.agents.calculator:Calculator"])
    with pytest.raises(ValueError, match="unknown tool"):
        resolve_tools(["abacus"])

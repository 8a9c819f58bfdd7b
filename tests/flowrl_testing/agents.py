"""Test helpers for multi-turn rollouts: parsers that make an untrained model "call" tools."""

from __future__ import annotations

from flowrl.agents.parsers import ParsedTurn, ToolCall


def always_calculator(text: str) -> ParsedTurn:
    """Every turn calls ``calculator(1+1)``: a random model then runs until max turns or budget."""
    return ParsedTurn(calls=[ToolCall("calculator", {"expression": "1+1"})])

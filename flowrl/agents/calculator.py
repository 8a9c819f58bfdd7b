"""The built-in ``calculator`` tool: arithmetic on integers and decimals, parsed by hand.

No ``eval``, no ``ast``-to-code: a recursive-descent parser over ``+ - * / // % **``, parentheses
and unary signs, with bounds (expression length, exponent size, result digits) so a call cannot
make the rollout rank spend unbounded time or memory. Integers stay exact; ``/`` gives a decimal
(an integral quotient is written without ``.0``).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from flowrl.agents.tools import Tool

__all__ = ["Calculator", "calculate"]

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_RESULT_DIGITS = 100
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?|\.\d+)|(\*\*|//|[-+*/%()]))")


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"unexpected character {text[pos:].lstrip()[:1]!r} at position {pos}")
        out.append(m.group(1) or m.group(2))
        pos = m.end()
    return out


class _Parser:
    """expr := term (('+'|'-') term)*; term := unary (('*'|'/'|'//'|'%') unary)*;
    unary := ('+'|'-') unary | power; power := atom ('**' unary)?; atom := number | '(' expr ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.i = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ValueError("the expression ends too early")
        self.i += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            value = value + self.term() if self.take() == "+" else value - self.term()
        return _bounded(value)

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/", "//", "%"):
            op, rhs = self.take(), self.unary()
            if op != "*" and rhs == 0:
                raise ValueError("division by zero")
            value = {"*": lambda: value * rhs, "/": lambda: value / rhs,
                     "//": lambda: Fraction(value // rhs), "%": lambda: value % rhs}[op]()
            _bounded(value)
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("+", "-"):
            return self.unary() if self.take() == "+" else -self.unary()
        return self.power()

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek() != "**":
            return base
        self.take()
        exponent = self.unary()
        if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT:
            raise ValueError(f"exponents must be integers with |e| <= {MAX_EXPONENT}")
        if base == 0 and exponent < 0:
            raise ValueError("division by zero")
        return _bounded(base ** int(exponent))

    def atom(self) -> Fraction:
        tok = self.take()
        if tok == "(":
            value = self.expr()
            if self.take() != ")":
                raise ValueError("missing ')'")
            return value
        if tok[0].isdigit() or tok[0] == ".":
            return Fraction(tok)
        raise ValueError(f"unexpected {tok!r}")


def _bounded(value: Fraction) -> Fraction:
    if max(len(str(abs(value.numerator))), len(str(value.denominator))) > MAX_RESULT_DIGITS:
        raise ValueError(f"the result has more than {MAX_RESULT_DIGITS} digits")
    return value


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.12g}"


def calculate(expression: str) -> str:
    """The value of an arithmetic ``expression`` as text; ValueError for anything else."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    parser = _Parser(_tokens(expression))
    value = parser.expr()
    if parser.peek() is not None:
        raise ValueError(f"unexpected {parser.peek()!r} after a complete expression")
    return _format(value)


class Calculator(Tool):
    """``calculator(expression)``: evaluates arithmetic exactly (see the module docstring)."""

    name = "calculator"
    schema = {
        "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    }

    def __init__(self, *, name: str = "calculator", argument: str = "expression") -> None:
        self.name = name
        self.argument = argument
        if argument != "expression":
            self.schema = {**self.schema, "parameters": {"type": "object", "properties": {argument: {"type": "string"}},
                                                          "required": [argument]}}

    async def call(self, args: dict, state: Any) -> str:
        if set(args) != {self.argument}:
            raise ValueError(f"expected the single argument {self.argument!r}, got {sorted(args)}")
        return calculate(args[self.argument])

"""Every config key with its default and its docstring (``flowrl config --fields``, and the
suggestions of :mod:`flowrl.config.verl_load`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from flowrl.config.schema import RunConfig


def describe_fields(cls: Any = RunConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, docstring) for every field, from the attribute docstrings."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for stmt, nxt in zip(body, body[1:]):
            if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[stmt.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[union-attr]
    rows: list[tuple[str, str, str]] = []
    instance = cls()
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            rows.extend(describe_fields(type(value), key + "."))
        else:
            rows.append((key, repr(value), docs.get(f.name, "")))
    return rows

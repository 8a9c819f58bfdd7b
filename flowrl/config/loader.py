"""YAML + ``key.sub=value`` overrides -> :class:`RunConfig`, strictly.

Unknown keys, wrong types and impossible values raise :class:`ConfigError` naming the full dotted
key, the value and the fix. Nothing here starts a worker or imports torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from flowrl.config.cluster_spec import merge_spec
from flowrl.config.errors import ConfigError
from flowrl.config.schema import RunConfig


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Build a :class:`RunConfig` from an optional YAML file and dotted overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError("CONFIG", str(path), "no such file", "pass an existing YAML file or none")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("CONFIG", str(path), f"is not valid YAML ({exc})", "fix the YAML syntax") from exc
        if not isinstance(loaded, dict):
            raise ConfigError("CONFIG", str(path), "must hold a mapping at the top level", "write `section: {key: value}`")
        data = loaded
    for item in overrides:
        apply_override(data, item)
    if isinstance(data.get("cluster"), dict) and data["cluster"].get("spec"):
        # cluster.spec=PATH: the spec's keys under the run's
        data["cluster"] = merge_spec(data["cluster"], base_dir=Path(path).parent if path is not None else None)
    return from_dict(RunConfig, data)


def apply_override(data: dict[str, Any], item: str) -> None:
    """Set ``a.b.c=value`` into the nested dict ``data`` (the value parsed as YAML)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(item, item, "is not an override", "write overrides as key.sub=value, e.g. actor.optim.lr=1e-3")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(key, value, f"{part!r} is a value, not a section", "override the value itself")
        node = child
    node[parts[-1]] = value


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, checking every key and type."""
    if not isinstance(data, dict):
        raise ConfigError(prefix or "CONFIG", data, "must be a mapping of keys", f"write {prefix}.<key>=<value>")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            fix = f"did you mean {prefix + '.' if prefix else ''}{close[0]}?" if close else "valid keys: " + ", ".join(fields)
            raise ConfigError(full, value, "unknown key", fix)
        kwargs[key] = _coerce(hints[key], value, full)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise exc.under(prefix) from None


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        if value is None and type(None) in get_args(tp):
            return None
        errors = []
        for option in options:
            try:
                return _coerce(option, value, key)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(key, value, "is not one of " + ", ".join(map(str, allowed)), f"use one of {', '.join(map(str, allowed))}")
        return value
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(key, value, f"expected a list of {len(args)} values", f"write {key}=[{', '.join('...' for _ in args)}]")
        return tuple(_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is list:
        (arg,) = get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(key, value, "expected a list", f"write {key}=[...]")
        return [_coerce(arg, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, value, f"expected true or false, got {type(value).__name__}", f"write {key}=true or {key}=false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(key, value, f"expected an integer, got {type(value).__name__}", f"write e.g. {key}=8")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(key, value, f"expected a number, got {type(value).__name__}", f"write e.g. {key}=1e-3")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(key, value, f"expected a string, got {type(value).__name__}", f"write {key}=<text>")
    raise TypeError(f"config field {key} has an unsupported annotation {tp!r}")  # internal: schema bug


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict (tuples as lists) for YAML/JSON."""

    def convert(v: Any) -> Any:
        if isinstance(v, tuple):
            return [convert(x) for x in v]
        if isinstance(v, dict):
            return {k: convert(x) for k, x in v.items()}
        return v

    return convert(dataclasses.asdict(cfg))


def dump_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (loadable by :func:`load_config`)."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def describe_fields(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, str]]:
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

"""YAML + ``key.sub=value`` overrides -> :class:`RunConfig`, strictly.

Unknown keys, wrong types and impossible values raise :class:`ConfigError` naming the full dotted
key, the value and the fix. Nothing here starts a worker or imports torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from flowrl.config.cluster_spec import merge_spec
from flowrl.config.errors import ConfigError, raise_all
from flowrl.config.fields import describe_fields  # noqa: F401 - re-exported (flowrl config --fields)
from flowrl.config.schema import RunConfig


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Build a :class:`RunConfig` from an optional YAML file and dotted overrides.

    verl's keys are accepted as they are (mapped by :mod:`flowrl.config.verl`); a verl YAML
    (Hydra ``defaults:``, ``actor_rollout_ref``) is composed with Hydra. Every mistake of the
    file and the command line is reported at once (:class:`~flowrl.config.errors.ConfigErrors`).
    """
    return load_config_with_notes(path, overrides)[0]


def load_config_with_notes(path: str | Path | None = None,
                           overrides: list[str] | tuple[str, ...] = ()) -> tuple[RunConfig, list[str], set[str]]:
    """:func:`load_config`, the notes of accepted verl keys that change nothing in flowrl, and
    the dotted flowrl keys the file and overrides set."""
    errors: list[ConfigError] = []
    data, notes, origin = resolve_data(path, overrides, errors)
    cfg = from_dict(RunConfig, data, errors=errors)
    if cfg is None:  # a section did not build: the checks of whole names still run (one pass)
        errors.extend(_name_mistakes(data, {e.key for e in errors}))
    raise_all([_as_typed(e, origin) for e in errors])
    from flowrl.config.verl_yaml import flatten

    return cfg, notes, set(flatten(data))


def _name_mistakes(data: dict[str, Any], reported: set[str]) -> list[ConfigError]:
    """:func:`~flowrl.config.schema.name_mistakes` of ``data``'s algorithm section (flowrl's
    defaults where unset), those not reported already."""
    from flowrl.config.schema import AlgorithmConfig, name_mistakes

    algo = data.get("algorithm") if isinstance(data.get("algorithm"), dict) else {}
    defaults = AlgorithmConfig()
    found = name_mistakes(algo.get("adv_estimator", defaults.adv_estimator), algo.get("kl_penalty", defaults.kl_penalty))
    return [e for e in found if e.key not in reported]


def _as_typed(exc: ConfigError, origin: dict[str, str]) -> ConfigError:
    """The error under the verl key the user wrote, when a verl key was translated."""
    verl_key = origin.get(exc.key)
    if verl_key is None:
        return exc
    return ConfigError(f"{verl_key} (flowrl's {exc.key})", exc.value, exc.problem, exc.fix)


def resolve_data(path: str | Path | None, overrides: list[str] | tuple[str, ...],
                 errors: list[ConfigError]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """The flowrl-form nested dict of a YAML file and overrides, and the notes of accepted verl
    keys that change nothing; every translation mistake is appended to ``errors``."""
    from flowrl.config.verl_load import translate_all

    items = []
    for item in overrides:
        try:
            items.append((*parse_override(item), item))
        except ConfigError as exc:
            errors.append(exc)
    data: dict[str, Any] = {}
    yaml_items: list[tuple[str, Any, bool]] = []
    if path is not None:
        loaded = _read_yaml(Path(path))
        from flowrl.config.verl_yaml import compose_verl_yaml, flatten

        if _is_verl_yaml(loaded):
            yaml_items, items = compose_verl_yaml(Path(path), items)
        else:  # flowrl's YAML: its keys are read as overrides are (verl names too)
            yaml_items = [(key, value, "set") for key, value in flatten(loaded).items()]
    flat, notes, origin = translate_all(yaml_items, [(k, v) for k, v, _ in items], errors)
    for key, value in flat.items():
        try:
            _set(data, key, value)
        except ConfigError as exc:
            errors.append(exc)
    if isinstance(data.get("cluster"), dict) and data["cluster"].get("spec"):
        # cluster.spec=PATH: the spec's keys under the run's
        data["cluster"] = merge_spec(data["cluster"], base_dir=Path(path).parent if path is not None else None)
    return data, notes, origin


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError("CONFIG", str(path), "no such file", "pass an existing YAML file or none")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError("CONFIG", str(path), f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}, "
                          f"line {line})", "save the file as UTF-8") from None
    try:
        loaded = yaml.load(text, Loader=StrictLoader) or {}  # noqa: S506 - a SafeLoader
    except DuplicateKeyError as exc:
        raise ConfigError("CONFIG", str(path), str(exc), "keep one of them (YAML would silently use the last)") from None
    except AliasBombError as exc:
        raise ConfigError("CONFIG", str(path), str(exc), "write the values out instead of nesting aliases") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigError("CONFIG", str(path), f"is not valid YAML ({exc})", "fix the YAML syntax") from None
    if not isinstance(loaded, dict):
        raise ConfigError("CONFIG", str(path), "must hold a mapping at the top level", "write `section: {key: value}`")
    return loaded


class DuplicateKeyError(yaml.YAMLError):
    """A mapping of a YAML file names one key twice."""


class AliasBombError(yaml.YAMLError):
    """A YAML file whose aliases expand to more values than any config holds."""


MAX_YAML_VALUES = 100_000
"""The most values a config file may expand to through its aliases (verl's ppo_trainer.yaml
holds about 1,000; a "billion laughs" file billions)."""


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a key given twice in one mapping (naming it and both
    lines) and a document whose aliases expand to more than :data:`MAX_YAML_VALUES` values
    (checked on the composed node graph, before anything is expanded)."""

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None:
            size = _expanded_size(node, {})
            if size > MAX_YAML_VALUES:
                raise AliasBombError(f"expands through its aliases to more than {MAX_YAML_VALUES:,} values")
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                line = key_node.start_mark.line + 1
                if key_node.value in first:
                    raise DuplicateKeyError(f"names the key {key_node.value!r} twice in one mapping (lines "
                                            f"{first[key_node.value]} and {line})")
                first[key_node.value] = line
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: Any, memo: dict[int, int]) -> int:
    """Values under ``node`` with every alias expanded (each shared node counted once per use)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a recursive alias counts once
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    else:
        children = []
    size = 1
    for child in children:
        size += _expanded_size(child, memo)
        if size > MAX_YAML_VALUES:
            break
    memo[id(node)] = size
    return size


def _is_verl_yaml(loaded: dict[str, Any]) -> bool:
    from flowrl.config.verl import VERL_SECTIONS

    return "defaults" in loaded or any(k in loaded for k in VERL_SECTIONS)


def apply_override(data: dict[str, Any], item: str) -> None:
    """Set ``a.b.c=value`` into the nested dict ``data`` (the value parsed as YAML)."""
    key, value = parse_override(item)
    _set(data, key, value)


def parse_override(item: str) -> tuple[str, Any]:
    """``(key, value)`` of ``a.b.c=value``: the value parsed as YAML; Hydra's ``+``/``++``
    prefixes are dropped (flowrl's keys all exist)."""
    key, sep, raw = item.partition("=")
    key = key.strip().lstrip("+")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(item, item, "is not an override", "write overrides as key.sub=value, e.g. actor.optim.lr=1e-3")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(key, value, f"{part!r} is a value, not a section", "override the value itself")
        node = child
    node[parts[-1]] = value


def from_dict(cls: type, data: Any, prefix: str = "", errors: list[ConfigError] | None = None) -> Any:
    """Build dataclass ``cls`` from a mapping, checking every key and type. Every mistake is
    collected (``errors``); at the top they are raised together."""
    own, errors = errors is None, [] if errors is None else errors
    result = None
    if not isinstance(data, dict):
        errors.append(ConfigError(prefix or "CONFIG", data, "must be a mapping of keys", f"write {prefix}.<key>=<value>"))
    else:
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        kwargs: dict[str, Any] = {}
        broken = False  # a field that did not coerce: the section is not built (unknown keys are only left out)
        for key, value in data.items():
            full = f"{prefix}.{key}" if prefix else str(key)
            if key not in fields:
                errors.append(ConfigError(full, value, "unknown key", _suggest(full, list(fields), prefix)))
                continue
            mark = len(errors)
            try:
                kwargs[key] = _coerce(hints[key], value, full, errors)
            except ConfigError as exc:
                errors.append(exc)
            broken = broken or len(errors) > mark
        if not broken:
            try:
                result = cls(**kwargs)
            except ConfigError as exc:
                errors.append(exc.under(prefix))
    if own:
        raise_all(errors)
    return result


def _suggest(full: str, fields: list[str], prefix: str) -> str:
    from flowrl.config.verl_load import suggest

    return suggest(full) or (
        f"did you mean {prefix + '.' if prefix else ''}{difflib.get_close_matches(full.rsplit('.', 1)[-1], fields, n=1)[0]}?"
        if difflib.get_close_matches(full.rsplit(".", 1)[-1], fields, n=1) else "valid keys: " + ", ".join(fields))


def _coerce(tp: Any, value: Any, key: str, errors: list[ConfigError] | None = None) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key, errors)
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
    if origin is dict:  # a mapping handed on as it is (rollout.engine_kwargs: vllm.LLM's arguments)
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(key, value, "expected a mapping of names to values", f"write {key}.<name>=<value>")
        return dict(value)
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
        return _coerce_float(value, key)
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(key, value, f"expected a string, got {type(value).__name__}", f"write {key}=<text>")
    raise TypeError(f"config field {key} has an unsupported annotation {tp!r}")  # internal: schema bug


def _coerce_float(value: Any, key: str) -> float:
    """A finite number (YAML 1.1 reads 1e-3 as a string); inf and nan would only surface as NaN
    losses steps later, so every float key refuses them."""
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None:
        raise ConfigError(key, value, f"expected a number, got {type(value).__name__}", f"write e.g. {key}=1e-3")
    if not math.isfinite(number):
        raise ConfigError(key, value, "must be a finite number", f"write a finite value, e.g. {key}=1e-3")
    return number


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

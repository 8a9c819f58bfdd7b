"""verl keys -> flowrl keys for a whole command line (and a composed verl YAML), by the table
of :mod:`flowrl.config.verl`; and the suggestions for an unknown key (the table, then the field
docs, then edit distance).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from functools import lru_cache
from typing import Any

from flowrl.config.errors import ConfigError
from flowrl.config.verl import (_EXACT, DROP, KNOCK_ON, REFUSED_VALUES, VERL_KEYS, alias, derive, field_exists, lookup,
                                translate_default, translate_item, verl_value)


def translate_all(yaml_items: list[tuple[str, Any, str]], cli_items: list[tuple[str, Any]],
                  errors: list[ConfigError]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """The flowrl-form flat overrides of ``yaml_items`` (``(key, value, state)`` of a composed
    verl YAML, see :func:`~flowrl.config.verl_yaml.compose_verl_yaml`) then ``cli_items`` (later ones win), and the notes of accepted no-op
    keys, and which verl key set each translated flowrl key. Mistakes are appended to ``errors``; YAML keys left at verl's default that flowrl has
    no field for are skipped (they do what flowrl does: verl's default run)."""
    cli_items = _apply_deletions(cli_items)
    reported = len(errors)
    verl_flat = {k: v for k, v, _ in yaml_items}
    verl_flat.update(cli_items)
    out: dict[str, Any] = {}
    try:
        out.update(derive(verl_flat))
    except ConfigError as exc:
        errors.append(exc)
    if "trainer.total_epochs" in verl_flat and verl_flat.get("trainer.total_training_steps") is None:
        out["trainer.total_training_steps"] = 0  # verl: the epochs decide
    notes: list[str] = []
    for key, value, state in yaml_items:
        if state != "inert":  # a verl YAML's -1 of save_freq / test_freq is flowrl's 0 (never)
            value = alias(key, value) if state == "default" else value
            _one(out, {}, notes, errors, key, value, state == "default")
    set_by: dict[str, str] = {}
    for key, value in cli_items:
        _one(out, set_by, notes, errors, key, value, False)
    for refused in {_refused_by_name(exc) for exc in errors[reported:]}:
        for target in KNOCK_ON.get(refused, ()):
            out.pop(target, None)  # its check fails only because of the refusal already reported
    return out, notes, {target: key for target, key in set_by.items() if target != key}


def _refused_by_name(exc: ConfigError) -> str:
    """The :data:`~flowrl.config.verl_keys.KNOCK_ON` key of a refusal: the table key of a verl key
    refused by name, or the flowrl key of a value refused by name (``""`` for any other mistake)."""
    entry, target = lookup(exc.key)
    if entry is not None and entry.kind == "refuse":
        return entry.verl
    target = target or exc.key
    if isinstance(exc.value, str) and (target, exc.value) in REFUSED_VALUES:
        return target
    return ""


def _apply_deletions(items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Hydra's ``~key`` (``~key=value``: only if it holds that value) on a command line: the
    earlier overrides of ``key`` are dropped, and the deletion itself sets nothing."""
    from flowrl.config.verl_hydra import is_deletion

    out: list[tuple[str, Any]] = []
    for key, value in items:
        if is_deletion(key):
            gone = key[1:]
            out = [(k, v) for k, v in out if not (k == gone and (value == "" or v == value))]
        else:
            out.append((key, value))
    return out


def _one(out: dict[str, Any], set_by: dict[str, str], notes: list[str], errors: list[ConfigError],
         key: str, value: Any, at_default: bool) -> None:
    """Translate one key into ``out`` (``set_by``: which command-line key set each target)."""
    if key == "trainer.resume_mode" and value == "resume_path":
        return  # verl's token: derive() put trainer.resume_from_path there
    if field_exists(key):
        target: str | None = key
    else:
        try:
            target, note = translate_default(key, value) if at_default else translate_item(key, value)
        except ConfigError as exc:
            if not at_default:
                errors.append(exc)
            return
        if note and not at_default:
            notes.append(note)
    if target is None or (at_default and (value is None or not field_exists(target))):
        return
    if target != key and not field_exists(target):
        hint = suggest(target)
        errors.append(ConfigError(key, value, f"unknown key (as flowrl's {target})", hint or "see flowrl config --fields"))
        return
    if target != key:
        value = alias(target, value)
    try:
        value = verl_value(key, target, value)
    except ConfigError as exc:
        errors.append(exc)
        return
    if value is DROP:
        if not at_default:
            notes.append(f"{key}=None: derived (verl computes it; flowrl keeps {target}={_current(target)!r})")
        return
    earlier = set_by.get(target)
    if earlier is not None and earlier != key and out.get(target) != value:
        errors.append(ConfigError(key, value, f"sets flowrl's {target}, which {earlier}={out[target]!r} also sets",
                                  f"give only one of {earlier} and {key}"))
        return
    set_by[target] = key
    out[target] = value


def _current(target: str) -> Any:
    from flowrl.config.schema import RunConfig

    value: Any = RunConfig()
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


@lru_cache(maxsize=1)
def flowrl_keys() -> tuple[str, ...]:
    """Every dotted key of :class:`~flowrl.config.schema.RunConfig`."""
    from flowrl.config.schema import RunConfig

    def walk(obj: Any, prefix: str) -> list[str]:
        keys = []
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            keys.extend(walk(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else [prefix + f.name])
        return keys

    return tuple(walk(RunConfig(), ""))


def suggest(key: str) -> str:
    """A fix for unknown key ``key``: the table's mapping, a field of the same name in another
    section, a field whose doc names the key's words, or the closest name; ``""`` if none."""
    keys = flowrl_keys()
    last = key.rsplit(".", 1)[-1]
    same = [k for k in keys if k.rsplit(".", 1)[-1] == last and k != key]
    if same:
        return f"did you mean {same[0]}?"
    for entry in VERL_KEYS:
        if entry.verl.rsplit(".", 1)[-1] == last and entry.flowrl and not entry.flowrl.endswith("*"):
            return f"did you mean {entry.flowrl}? (verl's {entry.verl})"
    close = [c for c in difflib.get_close_matches(key, list(keys) + list(_EXACT), n=2, cutoff=0.75) if c != key]
    if close:
        _, target = lookup(close[0])
        return f"did you mean {close[0]}?" + (f" (flowrl's {target})" if target and target != close[0] else "")
    by_doc = _by_doc(key)
    if by_doc:
        return f"did you mean {by_doc}? (its doc: {_doc(by_doc)[:80]})"
    close = difflib.get_close_matches(last, [k.rsplit(".", 1)[-1] for k in keys], n=1, cutoff=0.7)
    if close:
        return f"did you mean {next(k for k in keys if k.endswith('.' + close[0]) or k == close[0])}?"
    return ""


@lru_cache(maxsize=1)
def _docs() -> dict[str, str]:
    from flowrl.config.fields import describe_fields

    return {key: doc for key, _, doc in describe_fields()}


def _doc(key: str) -> str:
    return _docs().get(key, "")


def _by_doc(key: str) -> str:
    """The field whose docstring holds the most of ``key``'s words (at least two)."""
    words = {w for w in re.split(r"[._]", key.lower()) if len(w) > 2}
    best, best_n = "", 1
    for k, doc in _docs().items():
        text = (k + " " + doc).lower()
        n = sum(1 for w in words if re.search(rf"\b{re.escape(w)}", text))
        if n > best_n:
            best, best_n = k, n
    return best

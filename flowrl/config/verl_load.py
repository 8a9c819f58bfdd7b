"""verl keys -> flowrl keys for a whole command line (and a composed verl YAML), by the table
of :mod:`flowrl.config.verl`; and the suggestions for an unknown key (the table, the same path
under another section, a typo inside the section: only suggestions that are right).
"""

from __future__ import annotations

import dataclasses
import difflib
from functools import lru_cache
from typing import Any

from flowrl.config.errors import ConfigError
from flowrl.config.verl import (_EXACT, AR, DROP, KNOCK_ON, REFUSED_VALUES, VERL_KEYS, alias, derive, field_exists,
                                lookup, translate_default, translate_item, verl_value)
from flowrl.config.verl_keys_megatron import ENGINE_IGNORES


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
    given = {key for key, _ in cli_items}
    missing = [key for key, _, state in yaml_items if state == "missing" and key not in given]
    errors.extend(_mandatory(key) for key in missing)
    strategy = str(verl_flat.get(f"{AR}.actor.strategy", ""))
    for key, value, state in yaml_items:
        if state in ("set", "written") and _engine_ignores(key, value, strategy, notes):
            continue
        if state == "written":  # at verl's default, written in the user's own file: explicit where not adopted
            state = "default" if _adopts(key) else "set"
        if state not in ("inert", "missing"):  # a verl YAML's -1 of save_freq / test_freq is flowrl's 0 (never)
            value = alias(key, value) if state == "default" else value
            _one(out, {}, notes, errors, key, value, state == "default")
    set_by: dict[str, str] = {}
    for key, value in cli_items:
        if not _engine_ignores(key, value, strategy, notes):
            _one(out, set_by, notes, errors, key, value, False)
    for key in missing:  # verl's mandatory rollout.name: flowrl's default engine would judge verl's sizes
        for target in KNOCK_ON.get(lookup(key)[1], ()):
            out.pop(target, None)
    for refused in {_refused_by_name(exc) for exc in errors[reported:]}:
        for target in KNOCK_ON.get(refused, ()):
            out.pop(target, None)  # its check fails only because of the refusal already reported
    return out, notes, {target: key for target, key in set_by.items() if target != key}


def _engine_ignores(key: str, value: Any, strategy: str, notes: list[str]) -> bool:
    """``key`` is one that verl's engine of ``strategy`` never reads (:data:`ENGINE_IGNORES`): noted
    as accepted with no effect, as verl takes it; it then sets nothing."""
    why = ENGINE_IGNORES.get((key, strategy))
    if why is not None:
        notes.append(f"{key}={value!r}: accepted, changes nothing in flowrl (actor.strategy={strategy}: {why})")
    return why is not None


def _adopts(key: str) -> bool:
    """Whether a verl YAML's default value of ``key`` is applied (the table's ``adopt``)."""
    entry, _ = lookup(key)
    return entry is None or entry.adopt


def _mandatory(key: str) -> ConfigError:
    """verl's mandatory ``???`` value of ``key``, left unset (verl stops on it too)."""
    _, target = lookup(key)
    if target == "rollout.name":
        fix = f"set {key}=vllm (or hf, flowrl's in-process engine)"
    else:
        fix = f"set {key}=<value> on the command line or in the YAML"
    return ConfigError(key, None, "is mandatory in verl (??? in its YAML) and not set", fix)


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
        if at_default and not _adopts(key):
            return  # verl's default of a key whose flowrl default stays (batching: auto)
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
    if target == key and not field_exists(key) and unknown_under_a_section(key):
        errors.append(ConfigError(key, value, "unknown key", suggest(key) or "see flowrl config --fields"))
        return
    if target != key and not field_exists(target):
        hint = suggest(target)
        errors.append(ConfigError(key, value, f"unknown key (as flowrl's {target})", hint or "see flowrl config --fields"))
        return
    value = alias(target, value)  # verl's spelling, also of a key whose path is flowrl's (filter_groups.metric)
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
    """A fix for unknown key ``key``, only where it is right: the flowrl key that the table maps the
    verl form of ``key`` to (``ref.megatron.tensor_model_parallel_size`` is verl's
    ``actor_rollout_ref.ref.megatron.tensor_model_parallel_size``: ``ref.tensor_model_parallel_size``),
    the same dotted path under another section (``rollout.ppo_mini_batch_size``:
    ``actor.ppo_mini_batch_size``), or a typo of a key of the same section; ``""`` if none. The
    same last name alone is not enough: ``reward_model.megatron.tensor_model_parallel_size`` is
    not ``rollout.tensor_model_parallel_size``."""
    by_table = _by_table(key)
    if by_table:
        return by_table
    keys = flowrl_keys()
    section, _, rest = key.partition(".")
    same_path = [k for k in keys if rest and k.partition(".")[2] == rest and k != key]
    if same_path:
        return f"did you mean {' or '.join(same_path[:3])}?"
    by_siblings = _among_siblings(key, keys)
    if by_siblings:
        return by_siblings
    known = list(keys) + list(_EXACT)
    if section in {k.partition(".")[0] for k in known}:  # a typo inside a section: a key of that section
        known = [k for k in known if k.partition(".")[0] == section]
    close = [c for c in difflib.get_close_matches(key, known, n=2, cutoff=0.75) if c != key]
    if close:
        _, target = lookup(close[0])
        return f"did you mean {close[0]}?" + (f" (flowrl's {target})" if target and target != close[0] else "")
    return ""


#: A section with at most this many keys is listed whole when an unknown key in it resembles none.
LIST_UP_TO = 16


def _among_siblings(key: str, keys: tuple[str, ...]) -> str:
    """For ``key`` in a known section (``trainer.checks.foo``) whose last name resembles no key of
    that section (flowrl's or verl's): the section's keys when they are few, not a key that only
    shares the prefix; ``""`` otherwise (a close name is the wider search's to name)."""
    parent, _, leaf = key.rpartition(".")
    siblings = [k.rpartition(".")[2] for k in keys if parent and k.rpartition(".")[0] == parent]
    verl_siblings = [k.rpartition(".")[2] for k in _EXACT if parent and k.rpartition(".")[0] == parent]
    if not siblings or len(siblings) > LIST_UP_TO or difflib.get_close_matches(leaf, siblings + verl_siblings, n=1,
                                                                               cutoff=0.75):
        return ""
    return f"use one of {parent}.{{{', '.join(siblings)}}}"


def _by_table(key: str) -> str:
    """``did you mean T? (verl's V)`` where ``key`` is (the tail of) exactly one verl key ``V`` of the
    table mapped to an existing flowrl key ``T`` (``""`` otherwise)."""
    if "." not in key:
        return ""
    found = {(entry.flowrl, entry.verl) for entry in VERL_KEYS
             if entry.kind in ("map", "dyn") and not entry.verl.endswith("*") and (entry.verl == key or entry.verl.endswith("." + key))
             and field_exists(entry.flowrl)}
    if len({target for target, _ in found}) != 1:
        return ""
    target, verl = sorted(found)[0]
    return f"did you mean {target}? (verl's {verl})"


def unknown_under_a_section(key: str) -> bool:
    """``key`` names no field inside a section that exists (``ref.megatron.x``, ``actor.optim.lrr``);
    ``False`` for an unknown section (the loader names it) and for a key inside a value (a dict field)."""
    from flowrl.config.schema import RunConfig

    node: Any = RunConfig()
    for depth, part in enumerate(key.split(".")):
        if not dataclasses.is_dataclass(node):
            return False
        if part not in {f.name for f in dataclasses.fields(node)}:
            return depth > 0
        node = getattr(node, part)
    return False

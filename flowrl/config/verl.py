"""verl's configuration keys: the one table that maps them onto flowrl's.

:data:`VERL_KEYS` is the single source of the mapping, read by the loader (verl keys on a
``flowrl train`` command line or in a verl YAML), by ``flowrl config --from-verl`` (the flowrl form
of a verl command line) and by the suggestions of an unknown key. An entry is one of

* ``map``: the value goes to the flowrl key (``.*`` entries map a whole sub-tree by prefix);
* ``dyn``: as ``map`` once the flowrl field exists (checked with ``dataclasses.fields`` when the
  config is built, so FSDP keys work the moment ``actor.fsdp_config`` lands); until then the
  ``accept`` values (what flowrl already does) pass and any other value is refused as not
  implemented yet;
* ``noop``: accepted, and the note says why it changes nothing in flowrl;
* ``refuse``: no flowrl equivalent: refused, naming what it does in verl and the nearest flowrl
  setting, unless the value is one of ``accept`` (verl's "off", which is flowrl's behaviour);
* ``derive``: read together with other keys by :func:`derive` (GPU counts, the custom reward
  function's path and name, ``resume_from_path``).

``verl`` (the last column) is verl's default where it differs from flowrl's: the run prints these
differences once at start when ``model.path`` is set (see :func:`default_differences`).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

from flowrl.config.errors import ConfigError
from flowrl.config.verl_batch import per_gpu_micro_batches
from flowrl.config.verl_reward import reward_manager
from flowrl.config.verl_rollout import turn_caps, vllm_engine_kwargs
from flowrl.config.verl_keys import (_NO, _OFF, AR, KNOCK_ON, REFUSED_VALUES, VERL_KEYS, VERL_NAMES,  # noqa: F401
                                     VerlKey, _k)  # the table, re-exported


#: verl's values that flowrl spells otherwise: applied to translated verl keys and to a verl
#: YAML's keys at their default.
VALUE_ALIASES: dict[tuple[str, Any], Any] = {
    ("trainer.save_freq", -1): 0, ("trainer.test_freq", -1): 0,  # verl's -1: never
    ("actor.strategy", "fsdp2"): "fsdp", ("critic.strategy", "fsdp2"): "fsdp",  # flowrl's fsdp strategy is FSDP2
    # verl's DAPO "reward": the sequence's reward before the KL penalty (rm_scores), flowrl's seq_reward
    ("algorithm.filter_groups.metric", "reward"): "seq_reward",
    ("model.dtype", "bf16"): "bfloat16", ("model.dtype", "fp32"): "float32",  # verl's short dtype names
    **{(f"{role}.fsdp_config.mixed_precision.{kind}_dtype", short): long for role in ("actor", "ref", "critic")
       for kind in ("param", "reduce", "buffer") for short, long in (("bf16", "bfloat16"), ("fp32", "float32"))},
}

_EXACT = {e.verl: e for e in VERL_KEYS if not e.verl.endswith(".*")}
_PREFIXES = sorted((e for e in VERL_KEYS if e.verl.endswith(".*")), key=lambda e: -len(e.verl))
VERL_SECTIONS = ("actor_rollout_ref", "custom_reward_function", "ray_init", "ray_kwargs", "global_profiler")


def lookup(key: str) -> tuple[VerlKey | None, str]:
    """The table's entry for verl key ``key`` and the flowrl key it maps to (``""`` if none)."""
    entry = _EXACT.get(key)
    if entry is None:
        entry = next((e for e in _PREFIXES if key.startswith(e.verl[:-1])), None)
    if entry is None:
        return None, ""
    if entry.verl.endswith(".*") and entry.flowrl.endswith(".*"):
        return entry, entry.flowrl[:-1] + key[len(entry.verl) - 1:]
    return entry, entry.flowrl


def field_exists(dotted: str) -> bool:
    """``dotted`` names a field of :class:`~flowrl.config.schema.RunConfig` (checked when called)."""
    from flowrl.config.schema import RunConfig

    cls: Any = RunConfig
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            return False
        match = {f.name: f for f in dataclasses.fields(cls)}.get(part)
        if match is None:
            return False
        cls = _dataclass_of(match)
    return True


def _dataclass_of(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return type(value) if dataclasses.is_dataclass(value) else None
    return None


def _refusal(key: str, value: Any, entry: VerlKey, *, pending: bool) -> ConfigError:
    what = f"in verl: {entry.does}" if entry.does else "a verl key"
    state = f"flowrl's {entry.flowrl} is not implemented yet" if pending else "flowrl has no equivalent"
    accepted = f" (accepted: {', '.join(map(repr, entry.accept[:3]))})" if entry.accept else ""
    return ConfigError(key, value, f"{what}; {state}{accepted}", f"drop it; nearest flowrl setting: {entry.nearest}")


def translate_item(key: str, value: Any) -> tuple[str | None, str | None]:
    """``(flowrl key or None, note or None)`` for one verl key; raises :class:`ConfigError` for a
    refused key. A key absent from the table comes back unchanged (the loader checks it)."""
    return _translate(key, value)


def alias(target: str, value: Any) -> Any:
    """``value`` in flowrl's spelling for flowrl key ``target`` (:data:`VALUE_ALIASES`)."""
    try:
        return VALUE_ALIASES.get((target, value), value)
    except TypeError:  # a list or dict value
        return value


def translate_default(key: str, value: Any) -> tuple[str | None, str | None]:
    """:func:`translate_item` for a verl YAML's key left at verl's default: ``None`` where the
    table says flowrl keeps its own default (``adopt=False``)."""
    entry, _ = lookup(key)
    if entry is not None and not entry.adopt:
        return None, None
    return _translate(key, value)


def _translate(key: str, value: Any) -> tuple[str | None, str | None]:
    entry, target = lookup(key)
    if entry is None:
        return key, None
    if entry.kind == "derive":  # read by derive()
        return None, None
    if entry.kind == "map":
        return target, None
    if entry.kind == "noop":
        return None, f"{key}={value!r}: accepted, changes nothing in flowrl ({entry.does}; {entry.nearest})"
    if entry.kind == "dyn":
        if entry.flowrl == "actor.strategy":
            if _strategy_known(alias(target, value)):
                return target, None
            raise _refusal(key, value, entry, pending=True)
        if field_exists(target):
            return target, None
        if _accepted(value, entry.accept) or is_verl_default(key, value):
            return None, f"{key}={value!r}: accepted, flowrl already behaves so"
        raise _refusal(key, value, entry, pending=True)
    if _accepted(value, entry.accept) or is_verl_default(key, value):
        return None, None
    typo = verl_typo(key) if entry.verl.endswith(".*") else ""
    if typo:  # under a refused prefix, but not a verl key: a typo of one (optim.lrr), not the feature
        _, target = lookup(typo)
        flowrl_form = f" (flowrl's {target})" if target and target != typo else ""
        raise ConfigError(key, value, "unknown key (verl has no such key either)", f"did you mean {typo}?{flowrl_form}")
    raise _refusal(key, value, entry, pending=False)


def verl_typo(key: str) -> str:
    """The verl 0.9.1 key that ``key`` (not one of verl's) misspells, among its siblings; ``""``
    if ``key`` is verl's, lies inside a verl mapping (``override_config.*``), or is close to none."""
    import difflib

    defaults = _verl_defaults()
    if not defaults or key in defaults or any(key.startswith(d + ".") for d in defaults):
        return ""
    parent = key.rpartition(".")[0]
    siblings = [d for d in defaults if d.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.8)
    return close[0] if close else ""


@lru_cache(maxsize=1)
def _verl_defaults() -> dict[str, list[Any]]:
    """verl's defaults, flat, from the installed wheel's generated configs ({} without the wheel):
    each key's defaults in the FSDP and the Megatron config."""
    from flowrl.config.verl_yaml import flatten, verl_config_dir

    tree, out = verl_config_dir(), {}
    if tree is None:
        return out
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # fast: a refusal is checked before any worker starts
    for name in ("_generated_ppo_megatron_trainer.yaml", "_generated_ppo_trainer.yaml"):
        if (tree / name).is_file():
            for key, value in flatten(yaml.load((tree / name).read_text(), Loader=loader) or {}).items():  # noqa: S506
                out.setdefault(key, []).append(value)
    return out


def is_verl_default(key: str, value: Any) -> bool:
    """``value`` is verl's own default of ``key`` (a refused feature left as verl leaves it)."""
    defaults = _verl_defaults().get(key, ())
    if any(_same(d, value) for d in defaults):
        return True
    if not defaults:  # a leaf under an interpolated mapping (rollout.mtp: ${...model.mtp}) exists once resolved
        parts = key.split(".")
        defaults = [d for i in range(1, len(parts)) for d in _verl_defaults().get(".".join(parts[:i]), ())]
    if any(isinstance(d, str) and "${" in d for d in defaults):  # under an interpolation: resolved (slower, rare)
        return any(_same(d, value) for d in _resolved_defaults().get(key, ()))
    return False


def _same(default: Any, value: Any) -> bool:
    """``value`` equals verl's ``default`` (YAML 1.1 reads ``1e-1`` as a string: numbers compared as numbers)."""
    if isinstance(default, str) and isinstance(value, float):
        try:
            return float(default) == value
        except ValueError:
            return False
    return type(default) is type(value) and default == value


@lru_cache(maxsize=1)
def _resolved_defaults() -> dict[str, list[Any]]:
    from omegaconf import OmegaConf

    from flowrl.config.verl_yaml import flatten, verl_config_dir

    tree, out = verl_config_dir(), {}
    for name in ("_generated_ppo_megatron_trainer.yaml", "_generated_ppo_trainer.yaml"):
        if tree is not None and (tree / name).is_file():
            for key, value in flatten(OmegaConf.to_container(OmegaConf.load(tree / name), resolve=True)).items():
                out.setdefault(key, []).append(value)
    return out


DROP = object()  # verl_value: the key sets nothing (flowrl keeps its setting)
_DERIVED = ("ppo_micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu", "forward_micro_batch_size_per_gpu",
            "micro_batch_size_per_gpu", "virtual_pipeline_model_parallel_size", "ppo_max_token_len_per_gpu",
            "log_prob_max_token_len_per_gpu", "forward_max_token_len_per_gpu")


def verl_value(key: str, target: str, value: Any) -> Any:
    """``value`` of verl key ``key`` as flowrl's ``target`` reads it: what it means in verl.

    ``-1`` (any value <= 0) of ``trainer.save_freq``/``test_freq`` is never (flowrl's 0); ``null``
    of ``trainer.total_training_steps`` is "the epochs decide" (0), of ``max_*_ckpt_to_keep`` keep
    all (0), of a micro-batch size or token budget derived (:data:`DROP`: flowrl keeps its own);
    a string logger is a list of one; a list of files is flowrl's comma-separated string;
    ``${oc.env:NAME}`` is resolved; an empty value of a boolean (``use_kl_loss=``) is false, as
    Python's truth reads it in verl; a rollout engine flowrl lacks is refused by name
    (:data:`REFUSED_VALUES`)."""
    if isinstance(value, str) and "${" in value:
        value = _resolve(key, value)
    last = target.rsplit(".", 1)[-1]
    if value == "" and _field_type(target) == "bool":
        return False  # verl reads ``key=`` (an empty string) with Python's truth: off
    if target in ("trainer.save_freq", "trainer.test_freq") and isinstance(value, int) and value < 0:
        return 0
    if value is None:
        if target in ("trainer.total_training_steps", "trainer.max_ckpt_to_keep"):
            return 0
        if last in _DERIVED or "None" not in _field_type(target):  # verl's null: unset (derived, or a
            return DROP  # deprecated key not in use): flowrl keeps its own setting
    if target in ("data.train_files", "data.val_files") and isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if target == "trainer.logger" and isinstance(value, str):
        value = [value]  # verl takes one logger as a string; the schema checks the names
    lacking_feature = REFUSED_VALUES.get((target, value)) if isinstance(value, str) else None
    if lacking_feature is not None:
        raise ConfigError(key, value, f"{lacking_feature[0]}; flowrl has no equivalent", lacking_feature[1])
    _refuse_verl_names(key, target, value)
    return value


def _field_type(dotted: str) -> str:
    """The annotation of :class:`~flowrl.config.schema.RunConfig`'s field ``dotted`` as written
    (``"bool"``, ``"int"``, ...; ``""`` if there is none)."""
    from flowrl.config.schema import RunConfig

    node: Any = RunConfig()
    *parents, last = dotted.split(".")
    for part in parents:
        node = getattr(node, part, None)
    if node is None or not dataclasses.is_dataclass(node):
        return ""
    match = {f.name: f for f in dataclasses.fields(node)}.get(last)
    kind = match.type if match is not None else ""
    return kind if isinstance(kind, str) else getattr(kind, "__name__", "")


def _refuse_verl_names(key: str, target: str, value: Any) -> None:
    """A verl estimator, policy loss or logger flowrl lacks (:data:`VERL_NAMES`), refused by name."""
    kind, verl_names = VERL_NAMES.get(target, ("", ()))
    names = value if isinstance(value, list) else [value]
    if not kind or not all(isinstance(n, str) for n in names):
        return
    ours = _FLOWRL_NAMES[target]()
    lacking = [n for n in names if n in verl_names and n not in ours]
    if lacking:
        own = "" if target == "trainer.logger" else ", or your own as package.module:function"
        raise ConfigError(key, value, f"in verl: the {', '.join(lacking)} {kind}; flowrl lacks it (flowrl has no "
                          "equivalent)", f"use one of {', '.join(ours)}{own}")


def _registered(registry: str) -> Any:
    def names() -> list[str]:
        from flowrl.catalog import algos

        return getattr(algos, registry).names()
    return names


def _loggers() -> tuple[str, ...]:
    from flowrl.config.sections import LOGGERS

    return LOGGERS


_FLOWRL_NAMES = {"algorithm.adv_estimator": _registered("ADVANTAGE_ESTIMATORS"),
                 "actor.policy_loss": _registered("POLICY_LOSSES"), "trainer.logger": _loggers}


def _resolve(key: str, value: str) -> Any:
    """``${oc.env:NAME[,default]}`` and other OmegaConf resolvers of a command-line value."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.create({"v": value}), resolve=True)["v"]  # type: ignore[index]
    except Exception as exc:  # noqa: BLE001 - an interpolation that does not resolve
        raise ConfigError(key, value, f"the interpolation does not resolve ({' '.join(str(exc).split())[:120]})",
                          "set the environment variable, or write the value") from None


def _accepted(value: Any, accept: tuple) -> bool:
    """``value`` is one of ``accept`` (booleans only as themselves: ``0`` is not ``False``)."""
    for a in accept:
        if isinstance(value, bool) or isinstance(a, bool):
            if value is a:
                return True
        elif type(value) is type(a) or isinstance(value, (int, float)) and isinstance(a, (int, float)):
            if value == a:
                return True
    return False


def _strategy_known(value: Any) -> bool:
    from flowrl.catalog.backends import TRAIN_BACKENDS

    return str(value) in TRAIN_BACKENDS.names()


def derive(flat: dict[str, Any]) -> dict[str, Any]:
    """The flowrl keys that several verl keys make together (``derive`` entries)."""
    out: dict[str, Any] = {}
    clip = flat.get(f"{AR}.actor.clip_ratio")
    if clip is not None:
        out["actor.clip_ratio_low"] = out["actor.clip_ratio_high"] = clip
    path = flat.get("custom_reward_function.path") or flat.get("reward.custom_reward_function.path")
    if path:
        name = flat.get("custom_reward_function.name") or flat.get("reward.custom_reward_function.name") or "compute_score"
        out["algorithm.reward_fn"] = f"{path}:{name}"
    if flat.get("trainer.resume_mode") == "resume_path":
        out["trainer.resume_mode"] = flat.get("trainer.resume_from_path") or ""
    if any(k.startswith(f"{AR}.") for k in flat) and f"{AR}.actor.strategy" not in flat and "actor.strategy" not in flat:
        if _strategy_known("fsdp"):  # verl's default engine, where flowrl has it
            out["actor.strategy"] = "fsdp"
    if flat.get(f"{AR}.rollout.multi_turn.tool_config_path") not in (None, "", "null"):
        out["rollout.multi_turn.tool_reward_coef"] = 0.0  # verl keeps its tools' step rewards out of the score
    out.update(per_gpu_micro_batches(flat))  # verl's global micro-batches, per GPU (verl_batch)
    out.update(turn_caps(flat))  # max_assistant_turns, max_user_turns + 1: max_turns (verl_rollout)
    out.update(vllm_engine_kwargs(flat))  # engine_kwargs.vllm.*: rollout.engine_kwargs.* (verl_rollout)
    out.update(_rollout_correction(flat))
    out.update(reward_manager(flat))  # naive, or dapo with its overlong penalty (verl_reward)
    gpus = flat.get("trainer.n_gpus_per_node")
    if gpus is not None:
        world = int(gpus) * int(flat.get("trainer.nnodes") or 1)
        out.update(_data_parallel_sizes(flat, world))
    return out


def _rollout_correction(flat: dict[str, Any]) -> dict[str, Any]:
    """verl's ``algorithm.rollout_correction.*`` as flowrl's ``algorithm.rollout_is*`` /
    ``rollout_rs*``: ``rollout_is`` (token | sequence | null) and ``rollout_is_threshold`` (a float or
    float-like string: TIS's upper bound; verl's default 2.0); bypass mode (``bypass_mode``,
    ``loss_type``, ``rollout_is_batch_normalize``, ``rollout_rs``, ``rollout_rs_threshold``); in bypass
    mode a ``lower_upper`` threshold is IcePop (``rollout_is_mode=mask`` with the lower bound). In
    decoupled mode IcePop and rejection sampling are refused by name."""
    prefix = "algorithm.rollout_correction."
    get = lambda name, default=None: flat.get(prefix + name, default)  # noqa: E731
    off = (None, "", "null", "none", "None")
    bypass = str(get("bypass_mode", False)).lower() == "true"
    out: dict[str, Any] = {}
    # outside bypass mode these are refused by flowrl's check (decoupled mode's are not built)
    if bypass:
        out["algorithm.rollout_is_bypass"] = True
    loss_type = get("loss_type", "ppo_clip")
    if loss_type not in off and (bypass or loss_type != "ppo_clip"):
        out["algorithm.rollout_is_loss_type"] = str(loss_type)
    if str(get("rollout_is_batch_normalize", False)).lower() == "true":
        out["algorithm.rollout_is_batch_normalize"] = True
    rs = get("rollout_rs")
    if rs not in off:
        threshold = get("rollout_rs_threshold")
        out["algorithm.rollout_rs"] = str(rs)
        out["algorithm.rollout_rs_threshold"] = None if threshold in off else str(threshold)
    level = get("rollout_is")
    if level in off:
        return out
    key = prefix + "rollout_is_threshold"
    threshold = get("rollout_is_threshold", 2.0)
    try:
        upper, lower = float(threshold), None
    except (TypeError, ValueError):
        from flowrl.algos.rollout_thresholds import parse_is_threshold

        if not bypass:
            raise ConfigError(key, threshold, "in verl: IcePop's lower_upper bounds (weights outside them zeroed); "
                              "flowrl has no equivalent in decoupled mode", "use one float (truncation), "
                              "bypass_mode=true (IcePop built there), or flowrl's algorithm.rollout_is_mode=mask "
                              "with rollout_is_threshold_lower") from None
        try:
            upper, lower = parse_is_threshold(threshold)
        except ValueError as exc:
            raise ConfigError(key, threshold, str(exc), "use a float, or 'lower_upper' (e.g. 0.5_2.0)") from None
    out.update({"algorithm.rollout_is": True, "algorithm.rollout_is_level": str(level),
                "algorithm.rollout_is_threshold": upper})
    if lower is not None:
        out.update({"algorithm.rollout_is_mode": "mask", "algorithm.rollout_is_threshold_lower": lower})
    return out


def _data_parallel_sizes(flat: dict[str, Any], world: int) -> dict[str, Any]:
    """verl colocates every role on all ``world`` GPUs: each group's data-parallel size is what is
    left of them after its tensor and pipeline split."""
    sizes = {}
    groups = [("actor", f"{AR}.actor"), ("ref", f"{AR}.actor"), ("rollout", f"{AR}.rollout")]
    if flat.get("algorithm.adv_estimator") == "gae":
        groups.append(("critic", "critic"))
    for group, prefix in groups:
        tp = int(flat.get(f"{prefix}.megatron.tensor_model_parallel_size") or flat.get(f"{prefix}.tensor_model_parallel_size") or 1)
        pp = int(flat.get(f"{prefix}.megatron.pipeline_model_parallel_size") or 1)
        if world % (tp * pp):
            raise ConfigError("trainer.n_gpus_per_node", world, f"is not divisible by {group}'s tensor x pipeline "
                              f"split {tp}x{pp}", "choose GPU counts that the tensor/pipeline sizes divide")
        sizes[f"{group}.data_parallel_size"] = world // (tp * pp)
    return sizes


def default_differences(cfg: Any, set_keys: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """``key=flowrl value (verl's default)`` for each table key whose verl default differs from
    flowrl's and that ``cfg`` leaves at flowrl's default, not named in ``set_keys`` (printed once
    when ``model.path`` is set: flowrl keeps its small defaults, and says where they are not
    verl's)."""
    from flowrl.config.schema import RunConfig

    fresh = RunConfig()
    out, seen = [], set(set_keys)
    for entry in VERL_KEYS:
        if entry.verl_default is _NO or not entry.flowrl or entry.flowrl.endswith("*") or entry.flowrl in seen:
            continue
        seen.add(entry.flowrl)
        ours = _get(cfg, entry.flowrl)
        default = _get(fresh, entry.flowrl)
        verl_value = tuple(entry.verl_default) if isinstance(default, tuple) else entry.verl_default
        if ours == default and default != verl_value:
            out.append(f"{entry.flowrl}={default!r} (verl's {entry.verl} defaults to {entry.verl_default!r})")
    return out


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


CLASSES = {"map": "mapped", "dyn": "mapped", "derive": "mapped", "noop": "accepted, no effect", "refuse": "refused by name"}


def classify(key: str) -> tuple[str, VerlKey | None, str]:
    """``(class, entry, flowrl key)`` of verl key ``key``: ``mapped`` (to an existing flowrl field,
    or read with other keys), ``accepted, no effect``, ``refused by name``, or ``unknown`` (no entry,
    or mapped to a flowrl field that does not exist)."""
    entry, target = lookup(key)
    if entry is None:
        return ("mapped", None, key) if field_exists(key) else ("unknown", None, "")
    if entry.kind == "map" and not field_exists(target):
        return "unknown", entry, target
    if entry.kind == "dyn" and not field_exists(target) and entry.flowrl != "actor.strategy":
        return "refused by name", entry, target
    return CLASSES[entry.kind], entry, target

"""A verl YAML (Hydra ``defaults:`` composition, ``${oc...}`` interpolation, or verl's generated
flat config) composed with Hydra's compose API and flattened to verl's dotted keys.

Which keys sit at verl's defaults is read from verl's own generated config next to the file
(``_generated_<name>.yaml``, ``_generated_ppo_trainer.yaml``) or in the installed ``verl``
package (``pip install --no-deps verl``): keys at their default that flowrl has no field for are
what flowrl does anyway and are skipped; every other key goes through the table.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any

from flowrl.config.errors import ConfigError

_MISSING = object()


def compose_verl_yaml(path: Path, items: list[tuple[str, Any, str]]) -> tuple[list[tuple[str, Any, str]], list[tuple[str, Any, str]]]:
    """``([(verl key, value, state)], overrides left for flowrl)``; ``state`` is ``set`` (differs
    from verl's default), ``default`` (verl's default, or an interpolation following another key:
    applied where flowrl has the field), ``written`` (verl's default, written in the user's own file:
    explicit for keys whose verl default flowrl does not adopt), ``missing`` (verl's mandatory ``???``, not given; the value
    is None) or ``inert`` (a default under a feature that is off: skipped). The overrides naming keys of the composed config go to Hydra (so interpolations
    follow them)."""
    try:
        from omegaconf import OmegaConf
    except ImportError as exc:
        raise ConfigError("CONFIG", str(path), f"is a verl (Hydra) YAML and hydra-core is not installed ({exc})",
                          "pip install hydra-core") from exc
    base = _compose(path, [])
    to_hydra = [i for i in items if OmegaConf.select(base, i[0].lstrip("~"), default=_MISSING) is not _MISSING]
    rest = [i for i in items if i not in to_hydra]
    cfg = _compose(path, [_hydra_override(*i).lstrip("+") for i in to_hydra]) if to_hydra else base
    flat = flatten(_container(cfg, path))
    reference = _reference(path, base)
    followers = _interpolated(cfg)
    written = _written(path) | {i[0] for i in to_hydra if not i[0].startswith("~")}  # the file's keys, the command line's
    off = [k[: -len("enable")] for k, v in flat.items() if k.endswith(".enable") and v in (False, None)
           and not (k == "critic.enable" and v is None and flat.get("algorithm.adv_estimator") == "gae")]
    # verl's critic.enable=null: a critic when algorithm.adv_estimator=gae (verl's need_critic)
    out = []
    for key, value in flat.items():
        at_default = reference is not None and key in reference and reference[key] == value
        if (at_default or _added(key, reference)) and any(key.startswith(p) for p in off):
            state = "inert"  # a default under a feature left off (``enable: false``), or a key of the user's file
            # that verl's config lacks there (recipe/fapo's reward_model.model.type): verl reads neither
        elif value == "???":
            state = "missing"  # verl's mandatory value, not given (``name: ???`` of the rollout)
        elif at_default and key in written:  # verl's default, written in the user's own file
            state = "written"
        elif at_default or key in followers:  # verl's default, or follows another key
            state = "default"
        else:
            state = "set"
        out.append((key, None if value == "???" else value, state))
    return out, rest


def _added(key: str, reference: dict[str, Any] | None) -> bool:
    """``key`` is not in verl's config (``reference``), nor inside one of its mappings: a user's file added it."""
    if reference is None or key in reference:
        return False
    parts = key.split(".")
    return not any(".".join(parts[:i]) in reference for i in range(1, len(parts)))


def _written(path: Path) -> set[str]:
    """The dotted keys the user's file itself writes (none for one of verl's own config files,
    whose every value is a default); the loader applies such a key even at verl's default."""
    import yaml

    if _verl_own(path):
        return set()
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return set()  # composed already: Hydra reported what is wrong with it
    return set(flatten({k: v for k, v in raw.items() if k != "defaults"})) if isinstance(raw, dict) else set()


def _verl_own(path: Path) -> bool:
    """``path`` lies in verl's config tree, or is one of its generated flat configs."""
    return (path.parent / "_generated_ppo_trainer.yaml").is_file() or path.stem.startswith("_generated_")


def _hydra_override(key: str, value: Any, raw: str) -> str:
    """The override to hand Hydra for ``raw``: Hydra's ``~key`` travels as ``~key=`` (the loader's
    parser wants a ``=``, see :mod:`flowrl.config.verl_hydra`) and goes back to ``~key``."""
    if key.startswith("~") and raw.endswith("=") and value == "":
        return raw[:-1]
    return raw


def _interpolated(cfg: Any, prefix: str = "") -> set[str]:
    """Dotted keys whose value is a ``${...}`` interpolation (they follow the key they name)."""
    from omegaconf import DictConfig, OmegaConf

    keys: set[str] = set()
    for key in cfg.keys():
        full = f"{prefix}{key}"
        if OmegaConf.is_interpolation(cfg, key):
            keys.add(full)
            continue
        node = cfg._get_node(key)
        if isinstance(node, DictConfig):
            keys |= _interpolated(node, full + ".")
    return keys


def _compose(path: Path, overrides: list[str]) -> Any:
    """Hydra's composition of ``path`` with ``overrides`` (cached: verl's tree takes seconds)."""
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = 0
    file = str(path.resolve())
    if overrides and all(_plain(o) for o in overrides):  # the base composed once, the values applied
        return _apply_overrides(_compose_cached(file, stamp, ()), tuple(overrides), path)
    return _compose_cached(file, stamp, tuple(overrides)).copy()


def _plain(override: str) -> bool:
    """``override`` sets a value (``a.b=v``, ``+a.b=v``, ``++a.b=v``, ``~a.b``), not a config group
    or a package (``a/b=x``, ``a@p=x``, ``a=x`` naming a group): Hydra applies it to the composed
    config, after the defaults list, as :func:`_apply_overrides` does."""
    key = override.lstrip("+~").partition("=")[0]
    return "." in key and "/" not in key and "@" not in key and not key.startswith("hydra.")


def _apply_overrides(base: Any, overrides: tuple[str, ...], path: Path) -> Any:
    """Hydra's own last step of ``compose`` (``ConfigLoaderImpl._apply_overrides_to_config``, in
    struct mode) on a copy of the composed ``base``: the same config, without composing verl's
    tree again (seconds per command line)."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    cfg = copy.deepcopy(base)
    OmegaConf.set_struct(cfg, True)
    try:
        ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(list(overrides)), cfg)
    except Exception as exc:  # noqa: BLE001 - Hydra's errors, shortened into one config error
        raise ConfigError("CONFIG", str(path), f"Hydra could not compose it: {_short(exc)}",
                          "check the defaults list and the override values") from None
    return cfg


@lru_cache(maxsize=32)
def _compose_cached(file: str, _stamp: int, overrides: tuple[str, ...]) -> Any:
    path = Path(file)
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(path.parent.resolve()), version_base=None):
            return compose(config_name=path.stem, overrides=_search_path(path) + list(overrides))
    except Exception as exc:  # noqa: BLE001 - Hydra's errors, shortened into one config error
        raise ConfigError("CONFIG", str(path), f"Hydra could not compose it: {_short(exc)}",
                          "check the defaults list and the override values") from None
    finally:
        GlobalHydra.instance().clear()


def _search_path(path: Path) -> list[str]:
    """A user's config directory (``defaults: [ppo_trainer, _self_]``) finds verl's configs: the
    installed tree is appended to Hydra's search path (after the file's own ``hydra.searchpath``)."""
    import yaml

    tree = verl_config_dir()
    if tree is None or path.parent.resolve() == tree.resolve():
        return []
    try:
        own = ((yaml.safe_load(path.read_text()) or {}).get("hydra") or {}).get("searchpath") or []
    except (OSError, yaml.YAMLError, AttributeError):
        own = []
    entries = [str(e) for e in own if isinstance(e, str) and _exists(str(e), path.parent)] + [f"file://{tree}"]
    return ["hydra.searchpath=[" + ",".join(entries) + "]"]


def _exists(entry: str, base: Path) -> bool:
    """A ``file://`` search-path entry that exists (relative: to the working directory or the
    file's own directory); ``pkg://`` entries are kept."""
    if not entry.startswith("file://"):
        return True
    where = Path(entry[len("file://"):])
    return where.is_dir() or (not where.is_absolute() and (base / where).is_dir())


def _base_name(path: Path) -> str:
    """The verl trainer config that ``path``'s defaults list extends (``ppo_trainer`` if none)."""
    import yaml

    try:
        defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
    except (OSError, yaml.YAMLError, AttributeError):
        return "ppo_trainer"
    names = [d if isinstance(d, str) else "" for d in defaults]
    return next((n for n in names if n in ("ppo_megatron_trainer", "ppo_trainer")), "ppo_trainer")


def _container(cfg: Any, path: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except Exception as exc:  # noqa: BLE001 - an interpolation that does not resolve
        raise ConfigError("CONFIG", str(path), f"an interpolation does not resolve: {_short(exc)}",
                          "fix the ${...} reference") from None


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted leaves of a nested mapping; Hydra's ``_target_`` (and other ``_`` keys) left out."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if str(key).startswith("_"):  # Hydra's _target_, _self_
            continue
        full = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, full + "."))
        else:
            out[full] = value
    return out


def _reference(path: Path, base: Any) -> dict[str, Any] | None:
    """verl's defaults, flat: the file itself (before the overrides) when it lies in verl's
    config tree; else verl's ``ppo_trainer`` from the installed package; else its generated
    flat config next to the file."""
    from omegaconf import OmegaConf

    if _verl_own(path):
        return flatten(_container(base, path))
    tree = verl_config_dir()
    if tree is not None and (tree / "ppo_trainer.yaml").is_file():
        return flatten(_container(_compose(tree / f"{_base_name(path)}.yaml", []), path))
    for candidate in (path.parent / f"_generated_{path.stem}.yaml",):
        if candidate.is_file():
            return flatten(OmegaConf.to_container(OmegaConf.load(candidate), resolve=True))  # type: ignore[arg-type]
    return None


def verl_config_dir() -> Path | None:
    """The config tree of the installed ``verl`` package (``pip install --no-deps verl``)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    tree = Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"
    return tree if tree.is_dir() else None

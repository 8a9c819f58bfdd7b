"""One small registry type for every extension point.

Algorithms (advantage estimators, policy losses, KL estimators, loss aggregation modes, KL
controllers), reward functions and backends all register here. Registering a name twice raises;
looking up an unknown name lists the valid ones. Entries may be registered by import string
(``"pkg.module:attr"``) so GPU-only packages (and torch) are imported only when chosen; traits
registered with an entry (``register(name, obj, needs_values=True)``) are read without importing it.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


def import_string(path: str) -> Any:
    """Import ``"package.module:attr"`` (or ``"package.module.attr"``) and return the attribute."""
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not an import string; write it as 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} from {path!r}: {exc}") from exc
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from exc
    return obj


class Registry(Generic[T]):
    """Name -> object, with lazy import strings, traits and user ``module:function`` lookups.

    An entry may carry *traits*: small facts about it that callers need without importing it (an
    advantage estimator's ``needs_values``, a backend's checkpoint kind). ``names()``, ``in`` and
    ``traits()`` of a registered name never import anything.
    """

    def __init__(self, kind: str, *, allow_import_strings: bool = False, trait_names: tuple[str, ...] = (),
                 wrap: str = "") -> None:
        self.kind = kind
        self.allow_import_strings = allow_import_strings
        self.trait_names = tuple(trait_names)
        """Traits read, as attributes, from the object a user's ``module:function`` names."""
        self.wrap = wrap
        """Import string of ``wrap(obj, **traits) -> entry``, applied once to an entry registered
        by import string when it is first looked up (advantage estimators: ``Estimator``); "" keeps
        the imported object as it is."""
        self._entries: dict[str, T | str] = {}
        self._traits: dict[str, dict[str, Any]] = {}
        self._unwrapped: dict[str, Any] = {}  # what an import-string entry imported, before ``wrap``

    def register(self, name: str, obj: T | str | None = None, **traits: Any) -> Callable[[T], T] | T | str:
        """Register ``obj`` under ``name`` with ``traits``; without ``obj`` returns a decorator.

        ``obj`` may be an import string, resolved on first lookup.
        """
        if obj is None:

            def decorator(fn: T) -> T:
                self._add(name, fn, traits)
                return fn

            return decorator
        self._add(name, obj, traits)
        return obj

    def _add(self, name: str, obj: T | str, traits: dict[str, Any]) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
        self._entries[name] = obj
        self._traits[name] = dict(traits)

    def get(self, name: str) -> T:
        if name in self._entries:
            entry = self._entries[name]
            if isinstance(entry, str):
                entry = self._unwrapped[name] = import_string(entry)
                if self.wrap:
                    entry = import_string(self.wrap)(entry, **self._traits[name])
                self._entries[name] = entry
            return entry  # type: ignore[return-value]
        if self.allow_import_strings and ":" in name:
            return import_string(name)
        raise self.unknown(name)

    def traits(self, name: str) -> dict[str, Any]:
        """The traits ``name`` was registered with (a copy; nothing is imported). For a user's
        ``module:function`` that is not registered: the attributes of the imported object named
        by ``trait_names`` that it has."""
        if name in self._entries:
            return dict(self._traits[name])
        if ":" in name and (self.allow_import_strings or self.trait_names):
            obj = import_string(name)
            return {t: getattr(obj, t) for t in self.trait_names if hasattr(obj, t)}
        raise self.unknown(name)

    def name_of(self, obj: Any) -> str | None:
        """The first registered name (sorted) whose entry is ``obj``: an import-string entry that
        names it (``module:qualname``; nothing is imported), or an imported entry that is ``obj``
        or was ``wrap``-ped from it. None if ``obj`` is not registered."""
        path = f"{getattr(obj, '__module__', '')}:{getattr(obj, '__qualname__', '')}"
        for name in self.names():
            entry = self._entries[name]
            if entry == path if isinstance(entry, str) else (entry is obj or self._unwrapped.get(name) is obj):
                return name
        return None

    def problem(self, name: str) -> str | None:
        """What keeps ``get(name)`` from resolving, or None: a registered name (nothing is
        imported), or where import strings are taken a ``package.module:attr`` that imports to a
        callable (the user's module is imported here, so a mistake shows before any worker starts)."""
        if name in self._entries:
            return None
        if not (self.allow_import_strings and ":" in name):
            return f"is not a registered {self.kind}"
        try:
            obj = import_string(name)
        except ValueError as exc:
            return f"is not an importable {self.kind} ({exc})"
        return None if callable(obj) else f"names {obj!r}, which is not callable; point it at a {self.kind} function"

    def fix(self) -> str:
        """The fix for a name :meth:`problem` refuses: the valid names (and the import string)."""
        return f"use one of {', '.join(self.names())}" + (
            ", or package.module:function (your own, importable on every worker)" if self.allow_import_strings else "")

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a test's or a plug-in's temporary entry); an unknown name raises."""
        if name not in self._entries:
            raise self.unknown(name)
        for table in (self._entries, self._traits, self._unwrapped):
            table.pop(name, None)

    def unknown(self, name: str) -> ValueError:
        """The error for a name that is not registered: it lists the valid ones."""
        hint = " or a 'module:function' import string" if self.allow_import_strings else ""
        return ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}{hint}")

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return sorted(self._entries)

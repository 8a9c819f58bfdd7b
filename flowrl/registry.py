"""One small registry type for every extension point.

Algorithms (advantage estimators, policy losses, KL estimators), reward functions and backends all
register here. Registering a name twice raises; looking up an unknown name lists the valid ones.
Entries may be registered by import string (``"pkg.module:attr"``) so GPU-only packages are
imported only when chosen.
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
    """Name -> object, with lazy import strings and user ``module:function`` lookups."""

    def __init__(self, kind: str, *, allow_import_strings: bool = False) -> None:
        self.kind = kind
        self.allow_import_strings = allow_import_strings
        self._entries: dict[str, T | str] = {}

    def register(self, name: str, obj: T | str | None = None) -> Callable[[T], T] | T | str:
        """Register ``obj`` under ``name``; without ``obj`` returns a decorator.

        ``obj`` may be an import string, resolved on first lookup.
        """
        if obj is None:

            def decorator(fn: T) -> T:
                self._add(name, fn)
                return fn

            return decorator
        self._add(name, obj)
        return obj

    def _add(self, name: str, obj: T | str) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
        self._entries[name] = obj

    def get(self, name: str) -> T:
        if name in self._entries:
            entry = self._entries[name]
            if isinstance(entry, str):
                entry = import_string(entry)
                self._entries[name] = entry
            return entry  # type: ignore[return-value]
        if self.allow_import_strings and ":" in name:
            return import_string(name)
        hint = " or a 'module:function' import string" if self.allow_import_strings else ""
        raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}{hint}")

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return sorted(self._entries)

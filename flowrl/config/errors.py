"""The one error type for a user's configuration mistake."""

from __future__ import annotations

import math
from typing import Any, Iterable


class ConfigError(ValueError):
    """A configuration mistake: names the key, the value and the fix.

    The CLI turns it into ``error: ...`` and exit code 2, before any worker starts.
    """

    def __init__(self, key: str, value: Any, problem: str, fix: str) -> None:
        self.key, self.value, self.problem, self.fix = key, value, problem, fix
        super().__init__(f"{key}={value!r}: {problem}; fix: {fix}")

    def under(self, prefix: str) -> "ConfigError":
        """The same error with its key placed under a section prefix (``actor.optim``)."""
        key = f"{prefix}.{self.key}" if prefix else self.key
        return ConfigError(key, self.value, self.problem, self.fix)


def check(ok: bool, key: str, value: Any, problem: str, fix: str) -> None:
    """Raise :class:`ConfigError` unless ``ok``."""
    if not ok:
        raise ConfigError(key, value, problem, fix)


def check_positive(key: str, value: float, fix: str) -> None:
    """Raise :class:`ConfigError` unless ``value > 0`` (and finite: ``inf`` is no size or rate)."""
    check(value > 0, key, value, "must be > 0", fix)
    check(math.isfinite(value), key, value, "must be a finite number", fix)


def check_one_of(key: str, value: str, allowed: Iterable[str]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``allowed`` (a tuple, or a
    registry's ``names()``), listing them: ``use one of a, b``."""
    allowed = list(allowed)
    check(value in allowed, key, value, "is not one of " + ", ".join(allowed), f"use one of {', '.join(allowed)}")


class ConfigErrors(ConfigError):
    """Several configuration mistakes of one command line or file, reported together (one
    ``error: ...`` line each)."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = list(errors)
        first = self.errors[0]
        self.key, self.value, self.problem, self.fix = first.key, first.value, first.problem, first.fix
        ValueError.__init__(self, "\n".join(str(e) for e in self.errors))

    def under(self, prefix: str) -> "ConfigErrors":
        return ConfigErrors([e.under(prefix) for e in self.errors])


def raise_all(errors: list[ConfigError]) -> None:
    """Raise the one error, or all of them as :class:`ConfigErrors`; nothing when empty."""
    flat = [x for e in errors for x in getattr(e, "errors", [e])]
    if len(flat) == 1:
        raise flat[0]
    if flat:
        raise ConfigErrors(flat)

"""Metric names (verl's), loggers, console output, the node timeline and the dashboard.

The face is lazy (PEP 562): ``flowrl.metrics.names`` is a plain module of constants that every
floor may import (ARCHITECTURE.md: floor 0), so importing it must not pull in the loggers."""

from __future__ import annotations

import importlib
from typing import Any

_LOGGER_NAMES = ("ConsoleLogger", "JsonlLogger", "MetricLoggers", "TensorBoardLogger", "console_line", "open_loggers",
                 "read_metrics")

__all__ = list(_LOGGER_NAMES)


def __getattr__(name: str) -> Any:
    if name in _LOGGER_NAMES:
        return getattr(importlib.import_module("flowrl.metrics.logger"), name)
    raise AttributeError(f"module 'flowrl.metrics' has no attribute {name!r}")

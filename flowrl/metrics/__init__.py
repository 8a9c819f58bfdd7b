"""Metric names (verl's), loggers, console output, the node timeline and the dashboard."""

from flowrl.metrics.logger import (
    ConsoleLogger,
    JsonlLogger,
    MetricLoggers,
    TensorBoardLogger,
    console_line,
    open_loggers,
    read_metrics,
)

__all__ = [
    "ConsoleLogger", "JsonlLogger", "MetricLoggers", "TensorBoardLogger", "console_line", "open_loggers", "read_metrics",
]

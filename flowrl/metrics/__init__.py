"""Metric names (verl's), loggers and console output."""

from flowrl.metrics.logger import JsonlLogger, console_line, read_metrics

__all__ = ["JsonlLogger", "console_line", "read_metrics"]

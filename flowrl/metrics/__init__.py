"""Metric names (verl's), loggers, console output, the node timeline and the dashboard.

``names`` (``from flowrl.metrics import names``) re-exports the floor-0 catalogue
``flowrl.catalog.metric_names``. The loggers are plain imports: ``logger.py`` imports only the
standard library at import time (TensorBoard, wandb and the config load inside the sinks that
need them).
"""

from flowrl.metrics.logger import (ConsoleLogger, JsonlLogger, MetricLoggers, TensorBoardLogger, console_line,
                                   open_loggers, read_metrics)

__all__ = ["ConsoleLogger", "JsonlLogger", "MetricLoggers", "TensorBoardLogger", "console_line", "open_loggers",
           "read_metrics"]

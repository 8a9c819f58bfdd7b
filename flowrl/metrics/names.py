"""The metric names under their usual import path (``from flowrl.metrics import names``): every
constant and name function of :mod:`flowrl.catalog.metric_names` (floor 0), where they are defined."""

from flowrl.catalog.metric_names import *  # noqa: F401,F403  (plain strings and name functions, no __all__)

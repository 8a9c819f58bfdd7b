"""The backend catalogue's old home: re-exports :mod:`flowrl.catalog.backends` (the specs of
every train, value and generation engine) for importers of ``flowrl.backends.registry``."""

from __future__ import annotations

from flowrl.catalog.backends import GEN_BACKENDS, TRAIN_BACKENDS, VALUE_BACKENDS

__all__ = ["GEN_BACKENDS", "TRAIN_BACKENDS", "VALUE_BACKENDS"]

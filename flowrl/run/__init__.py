"""The run: pre-flight checks, worker topology, the loop, weight-sync pipelining, checkpoints and
recovery, each in its own module. ``train(cfg)`` runs a whole job; ``Run`` is the notebook API."""

from flowrl.run.driver import Run
from flowrl.run.loop import RunSummary, train
from flowrl.run.preflight import default_cache_dir, resolve_inputs

__all__ = ["Run", "RunSummary", "default_cache_dir", "resolve_inputs", "train"]

"""Reshard transports: move parameter shards from the training layout to the generation layout.

The plan is pure (``flowrl.parallel.reshard_plan``, bucketed by ``reshard_schedule``); this package
executes it with torch: ``run_rank(job, ...)`` on every process of the plan (see ``exchange.py``),
described by a picklable :class:`ReshardJob` (``job.py``); with LoRA into an engine that serves
adapters, :class:`AdapterJob` moves the adapters only (``adapters.py``). Roles expose
``reshard(job)``; the graph node ``nodes.reshard`` calls both groups at once and reports
``reshard/*`` metrics. On any devices every tensor that crosses between processes is staged in
host memory and travels over gloo (``exchange.py``'s docstring says why; NCCL is a later step).
"""

from flowrl.backends.reshard.adapters import AdapterJob, run_adapter_rank, takes_adapters
from flowrl.backends.reshard.job import TRANSPORTS, ReshardJob, job_for_run, make_job

__all__ = ["TRANSPORTS", "AdapterJob", "ReshardJob", "job_for_run", "make_job", "run_adapter_rank", "run_rank",
           "takes_adapters"]


def run_rank(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - torch imported on first use
    """See :func:`flowrl.backends.reshard.exchange.run_rank`."""
    from flowrl.backends.reshard.exchange import run_rank as run

    return run(*args, **kwargs)

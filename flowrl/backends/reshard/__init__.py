"""Reshard transports: move parameter shards from the training layout to the generation layout.

The plan is pure (``flowrl.parallel.reshard_plan``, bucketed by ``reshard_schedule``); this package
executes it with torch: ``run_rank(job, ...)`` on every process of the plan (see ``exchange.py``),
described by a picklable :class:`ReshardJob` (``job.py``); with LoRA into an engine that serves
adapters, :class:`AdapterJob` moves the adapters only (``adapters.py``). Roles expose
``reshard(job)``; the graph node ``nodes.reshard`` calls both groups at once and reports
``reshard/*`` metrics. Tensors cross between processes on one of two wires (``wire_plan.py``,
``rounds.py``): in host memory over gloo (the CPU's, and wherever NCCL cannot serve), or, where the
device plan gives every process its own GPU and the group has NCCL, as device tensors in batched
rounds (``exchange.py``'s docstring says what has run where).
"""

from flowrl.backends.reshard.adapters import AdapterJob, run_adapter_rank, takes_adapters
from flowrl.backends.reshard.job import TRANSPORTS, ReshardJob, job_for_run, make_job

__all__ = ["TRANSPORTS", "AdapterJob", "ReshardJob", "job_for_run", "make_job", "run_adapter_rank", "run_rank",
           "takes_adapters"]


def run_rank(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - torch imported on first use
    """See :func:`flowrl.backends.reshard.exchange.run_rank`."""
    from flowrl.backends.reshard.exchange import run_rank as run

    return run(*args, **kwargs)

"""Worker-death recovery: rebuild the worker groups and continue from the last checkpoint.

A rank's worker process can die mid-step (OOM kill, segfault, ``kill -9``). Its actor state is
gone and its peers' collectives fail, so the groups cannot continue. :class:`Recovery` decides
whether a step's exception is such a loss (some rank no longer answers a ping) and, within
``trainer.max_restarts``, rebuilds: the session's worker processes are replaced (a LocalCluster
is closed and started again; on an external scheduler the workers are restarted through their
nannies), the groups are created again and loaded from the newest checkpoint this run can use.
Steps after that checkpoint run again; the trainer drops their ``metrics.jsonl`` rows first and
their experience Parquet files are overwritten, so no step is missing or duplicated.

Which checkpoint: the last one this process saved, else the one the run resumed from, else
none (the run restarts at step 0 from ``model.path``). Checkpoints that an earlier run left in
the run directory are not used by a run started with ``trainer.resume_mode=disable``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from flowrl.actors.group import GroupLostError

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 10.0
"""How long a rank may take to answer the health-check ping after a failed step."""


def lost_ranks(session: Any, timeout_s: float = PING_TIMEOUT_S) -> list[str]:
    """``group[rank]`` of every rank whose actor does not answer a ping (its worker died)."""
    lost = []
    for group in list(session.groups.values()):
        futures = []
        for rank, actor in enumerate(group.actors):
            try:
                futures.append((rank, actor.ping()))
            except Exception:  # noqa: BLE001 - the handle itself is unusable: lost
                lost.append(f"{group.name}[{rank}]")
        for rank, future in futures:
            try:
                future.result(timeout=timeout_s)
            except Exception:  # noqa: BLE001 - lost worker, or no answer in time: both fatal
                lost.append(f"{group.name}[{rank}]")
    return lost


class Recovery:
    """The trainer's restart policy for one run (``trainer.max_restarts``)."""

    def __init__(self, run: Any, max_restarts: int) -> None:
        self.run = run
        self.max_restarts = max_restarts
        self.restarts = 0
        self.checkpoint: str | None = run.resume_from  # where a rebuild continues from

    def saved(self, path: str) -> None:
        """Record a checkpoint this run saved (the next rebuild continues from it)."""
        self.checkpoint = path

    def recover(self, exc: BaseException, step: int) -> int:
        """After ``exc`` ended step ``step``: rebuild and return the step to continue from, or
        re-raise ``exc`` if no worker was lost (a real error) or the restarts are used up."""
        run = self.run
        if run.session is None:
            raise exc
        lost = lost_ranks(run.session)
        if not lost:
            if isinstance(exc, GroupLostError):  # lost, yet every rank answers: do not loop
                log.error("step %d: %s, but every rank answers a ping; not restarting", step, exc)
            raise exc
        if self.restarts >= self.max_restarts:
            log.error("step %d: worker(s) holding %s lost (%s); trainer.max_restarts=%d restarts used up, "
                      "stopping", step, ", ".join(lost), _short(exc), self.max_restarts)
            raise exc
        self.restarts += 1
        start = time.perf_counter()
        resume = self._resume_step()
        log.warning("step %d: worker(s) holding %s lost (%s); restart %d/%d: rebuilding the worker groups, "
                    "continuing from %s (steps %d..%d run again)", step, ", ".join(lost), _short(exc),
                    self.restarts, self.max_restarts, self.checkpoint or "the initial model", resume, step)
        self._rebuild(resume)
        log.warning("restart %d/%d: worker groups rebuilt in %.1fs; continuing at step %d",
                    self.restarts, self.max_restarts, time.perf_counter() - start, resume)
        return resume

    def _resume_step(self) -> int:
        if self.checkpoint is None:
            return 0
        from flowrl.checkpoint import load_meta

        meta = load_meta(self.checkpoint)
        return int(meta.get("extra", {}).get("next_step", meta["step"]))

    def _reset_algorithm_state(self) -> None:
        """Driver-side algorithm state (e.g. the adaptive KL coefficient) back to the checkpoint's."""
        run = self.run
        if getattr(run, "algo_state", None) is None:
            return
        if self.checkpoint is None:
            from flowrl.trainer import _algorithm_state

            run.algo_state = _algorithm_state(run.cfg)
            return
        from flowrl.checkpoint import load_meta

        run.algo_state.load_state(load_meta(self.checkpoint).get("extra", {}).get("algorithm_state", {}))

    def _rebuild(self, resume: int) -> None:
        run = self.run
        session, run.session, run.groups = run.session, None, None
        run._pending_sync, run._carried = None, {}  # futures of the dead session
        if hasattr(run, "_sync_timeline"):
            run._sync_timeline = None  # the lost step's weight-sync spans never come
        session.groups.clear()  # broken groups cannot tear down in call order; their processes go
        try:
            if session.cluster is None:  # external scheduler: fresh processes through the nannies
                session.client.restart(timeout=session.startup_timeout_s)
        finally:
            session.close()
        run.resume_from = self.checkpoint
        run.next_step = resume
        self._reset_algorithm_state()
        run.start_workers()


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."


def rank_pids(client: Any) -> dict[tuple[str, int], int]:
    """``(group, rank) -> pid`` of every rank actor on ``client``'s workers (for operators and
    fault-injection tests: ``os.kill(pid, SIGKILL)``)."""
    found = client.run(_local_rank_pids)
    return {(g, r): pid for rows in found.values() for g, r, pid in rows}


def _local_rank_pids(dask_worker: Any) -> list[tuple[str, int, int]]:
    from flowrl.actors.rank import RankActor

    state = getattr(dask_worker, "state", None)
    actors = getattr(state, "actors", None) or getattr(dask_worker, "actors", {})
    return [(a.group, a.rank, os.getpid()) for a in actors.values() if isinstance(a, RankActor)]

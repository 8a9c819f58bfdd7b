"""Worker-death recovery as a state machine the loop drives.

A rank's worker process can die mid-step (OOM kill, segfault, ``kill -9``): its actor state is
gone and its peers' collectives fail, so the groups cannot continue. The controller worker (the
one that runs the graph's nodes) can die too: the session cancels the step's graph when the
scheduler removes it, and the health check reports ``controller``; the rebuild is the same. The loop reports every
failed step to :meth:`Recovery.on_failure`; the machine moves

    RUNNING --failure--> CHECKING --no rank lost / restarts used up--> FAILED (the error is re-raised)
                             |
                             +--ranks lost--> REBUILDING --loop rebuilt the run--> RUNNING

and, for a rebuild, answers with a :class:`Restart`: which ranks were lost, the checkpoint to
continue from and the step it continues at. The loop then rebuilds the run
(``Run.rebuild``: fresh worker processes, groups loaded from that checkpoint) and calls
:meth:`Recovery.rebuilt`. Steps after the checkpoint run again; the loop drops their
``metrics.jsonl`` and ``timeline.jsonl`` rows first and their experience files are overwritten,
so no step is missing or duplicated.

Which checkpoint: the last one this process saved, else the one the run resumed from, else none
(the run restarts at step 0 from ``model.path``). Checkpoints an earlier run left in the run
directory are not used by a run started with ``trainer.resume_mode=disable``.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from flowrl.actors import GroupLostError

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 10.0
"""How long a rank may take to answer the health-check ping after a failed step."""


class Phase(enum.Enum):
    RUNNING = "running"
    CHECKING = "checking"  # a step failed: is it a lost worker?
    REBUILDING = "rebuilding"  # the loop is replacing the workers
    FAILED = "failed"  # a real error, or the restarts are used up


@dataclass(frozen=True)
class Restart:
    """The decision to rebuild: the lost ranks, the checkpoint (None: the initial model) and the
    step the run continues at."""

    lost: list[str]
    checkpoint: str | None
    resume_step: int


def lost_ranks(session: Any, timeout_s: float = PING_TIMEOUT_S) -> list[str]:
    """``group[rank]`` of every rank whose actor does not answer a ping (its worker died), and
    ``controller`` when the worker that runs the graph's nodes is gone (``Session.controller``)."""
    lost = ["controller"] if controller_lost(session) else []
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


def controller_lost(session: Any) -> bool:
    """Whether the session's controller worker died (its graph tasks were cancelled) or is no
    longer among the scheduler's workers."""
    if getattr(session, "controller_lost", False):
        return True
    controller = getattr(session, "controller", None)
    if not controller:
        return False
    try:
        return controller not in session.worker_addresses()
    except Exception:  # noqa: BLE001 - the scheduler itself is gone: not a lost controller
        return False


class Recovery:
    """The restart policy of one run (``trainer.max_restarts``)."""

    def __init__(self, max_restarts: int, checkpoint: str | None = None) -> None:
        self.max_restarts = max_restarts
        self.restarts = 0
        self.checkpoint = checkpoint  # where a rebuild continues from
        self.phase = Phase.RUNNING
        self._started = 0.0

    def saved(self, path: str) -> None:
        """A checkpoint this run saved: the next rebuild continues from it."""
        self.checkpoint = path

    def on_failure(self, exc: BaseException, step: int, session: Any) -> Restart:
        """Step ``step`` ended with ``exc``: a :class:`Restart` if workers were lost and restarts
        remain; otherwise ``exc`` is re-raised unchanged."""
        self.phase = Phase.CHECKING
        lost = lost_ranks(session) if session is not None else []
        if not lost:
            self.phase = Phase.FAILED
            if isinstance(exc, GroupLostError):  # lost, yet every rank answers: do not loop
                log.error("step %d: %s, but every rank answers a ping; not restarting", step, exc)
            raise exc
        if self.restarts >= self.max_restarts:
            self.phase = Phase.FAILED
            log.error("step %d: worker(s) holding %s lost (%s); trainer.max_restarts=%d restarts used up, "
                      "stopping", step, ", ".join(lost), _short(exc), self.max_restarts)
            raise exc
        self.restarts += 1
        self.phase = Phase.REBUILDING
        self._started = time.perf_counter()
        resume = _resume_step(self.checkpoint)
        log.warning("step %d: worker(s) holding %s lost (%s); restart %d/%d: rebuilding the worker groups, "
                    "continuing from %s (steps %d..%d run again)", step, ", ".join(lost), _short(exc),
                    self.restarts, self.max_restarts, self.checkpoint or "the initial model", resume, step)
        return Restart(lost=lost, checkpoint=self.checkpoint, resume_step=resume)

    def rebuilt(self, step: int) -> None:
        """The loop rebuilt the run and continues at ``step``."""
        assert self.phase is Phase.REBUILDING, self.phase
        self.phase = Phase.RUNNING
        log.warning("restart %d/%d: worker groups rebuilt in %.1fs; continuing at step %d",
                    self.restarts, self.max_restarts, time.perf_counter() - self._started, step)


def _resume_step(checkpoint: str | None) -> int:
    if checkpoint is None:
        return 0
    from flowrl.checkpoint import load_meta

    meta = load_meta(checkpoint)
    return int(meta.get("extra", {}).get("next_step", meta["step"]))


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."


def rank_pids(client: Any) -> dict[tuple[str, int], int]:
    """``(group, rank) -> pid`` of every rank actor on ``client``'s workers (for operators and
    fault-injection tests: ``os.kill(pid, SIGKILL)``)."""
    found = client.run(_local_rank_pids)
    return {(g, r): pid for rows in found.values() for g, r, pid in rows}


def controller_pid(client: Any) -> int:
    """The pid of the controller worker (the one carrying the ``flowrl-controller`` resource),
    for fault-injection tests."""
    from flowrl.cluster import CONTROLLER

    workers = client.scheduler_info(n_workers=-1)["workers"]
    (address,) = [a for a, w in workers.items() if w.get("resources", {}).get(CONTROLLER)]
    return client.run(os.getpid, workers=[address])[address]


def _local_rank_pids(dask_worker: Any) -> list[tuple[str, int, int]]:
    from flowrl.actors.rank import RankActor

    state = getattr(dask_worker, "state", None)  # distributed moved the actors onto the worker state
    actors = getattr(state, "actors", None) or getattr(dask_worker, "actors", {})
    return [(a.group, a.rank, os.getpid()) for a in actors.values() if isinstance(a, RankActor)]

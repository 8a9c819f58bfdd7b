"""The restart policy of ``flowrl.recovery.Recovery`` with stand-in sessions (no workers): a real
error is re-raised, a lost worker rebuilds from the newest checkpoint this run can use, and
``trainer.max_restarts`` bounds the rebuilds."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from flowrl.actors.group import GroupLostError
from flowrl.checkpoint import checkpoint_dir, save_checkpoint
from flowrl.recovery import Recovery, lost_ranks


class _Answer:
    def __init__(self, alive: bool) -> None:
        self.alive = alive

    def result(self, timeout=None):  # noqa: ANN001, ANN201 - an ActorFuture stand-in
        if not self.alive:
            raise RuntimeError("Worker holding Actor was lost")
        return ("actor", 0, 123)


class _Actor:
    def __init__(self, alive: bool) -> None:
        self.alive = alive

    def ping(self) -> _Answer:
        return _Answer(self.alive)


class _Session:
    def __init__(self, alive: list[bool]) -> None:
        self.groups = {"rollout": SimpleNamespace(name="rollout", actors=[_Actor(True)]),
                       "actor": SimpleNamespace(name="actor", actors=[_Actor(a) for a in alive])}
        self.cluster = object()  # a LocalCluster: closed and started again
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _run(alive: list[bool], resume_from: str | None = None) -> SimpleNamespace:
    run = SimpleNamespace(session=_Session(alive), groups=object(), resume_from=resume_from, next_step=7,
                          _pending_sync=object(), _carried={"x": 1.0}, started=0)

    def start_workers() -> None:
        run.started += 1
        run.session = _Session([True] * len(alive))

    run.start_workers = start_workers
    return run


def test_lost_ranks_names_the_dead_ones():
    assert lost_ranks(_Session([True, False, True])) == ["actor[1]"]
    assert lost_ranks(_Session([True, True])) == []


def test_a_real_error_is_reraised_untouched():
    run = _run([True, True])
    error = ValueError("bad reward function")
    with pytest.raises(ValueError) as err:
        Recovery(run, 3).recover(error, 5)
    assert err.value is error and run.started == 0
    with pytest.raises(GroupLostError):  # "lost" while every rank answers: no restart loop
        Recovery(run, 3).recover(GroupLostError("actor.update: rank 1 was lost"), 5)


def test_lost_worker_rebuilds_from_the_last_saved_checkpoint(tmp_path, caplog):
    run = _run([True, False])
    old = run.session
    recovery = Recovery(run, 2)
    assert recovery.recover(GroupLostError("lost"), 7) == 0  # no checkpoint yet: from the start
    assert old.closed and old.groups == {} and run.started == 1 and run.next_step == 0
    assert run._pending_sync is None and run._carried == {} and run.resume_from is None

    path = save_checkpoint(checkpoint_dir(tmp_path, 4), step=4, params={"w": np.zeros(3, np.float32)},
                           extra={"next_step": 4, "algorithm_state": {"kl_ctrl": {"value": 0.25}}})
    recovery.saved(path)
    loaded = []
    run.algo_state = SimpleNamespace(load_state=loaded.append)  # e.g. the adaptive KL coefficient
    run.session = _Session([False, True])
    with caplog.at_level("WARNING", logger="flowrl.recovery"):
        assert recovery.recover(RuntimeError("Connection closed by peer"), 6) == 4
    assert run.resume_from == path and run.next_step == 4 and recovery.restarts == 2
    assert loaded == [{"kl_ctrl": {"value": 0.25}}]  # the driver's algorithm state goes back too
    assert any("restart 2/2" in r.getMessage() and "actor[0]" in r.getMessage() and "steps 4..6" in r.getMessage()
               for r in caplog.records)

    run.session = _Session([False, True])  # restarts used up: the error goes out
    error = GroupLostError("lost again")
    with pytest.raises(GroupLostError) as err:
        recovery.recover(error, 5)
    assert err.value is error and run.started == 2


def test_max_restarts_zero_fails_at_once():
    run = _run([False])
    with pytest.raises(GroupLostError):
        Recovery(run, 0).recover(GroupLostError("lost"), 0)
    assert run.started == 0

"""The restart policy of ``flowrl.run.recovery.Recovery`` and ``Run.rebuild`` with stand-in
sessions (no workers): a real error is re-raised, a lost worker rebuilds from the newest
checkpoint this run can use, and ``trainer.max_restarts`` bounds the rebuilds."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from flowrl.actors.group import GroupLostError
from flowrl.checkpoint import checkpoint_dir, save_checkpoint
from flowrl.checks import Limits, StepChecks
from flowrl.run import Run
from flowrl.run.recovery import Phase, Recovery, lost_ranks


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
        self.discarded = False

    def discard(self) -> None:  # flowrl.actors.Session.discard: groups dropped, processes gone
        self.groups.clear()
        self.discarded = True


class _Sync:
    def __init__(self) -> None:
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True


class _Source(_Sync):
    """A rollout source (``flowrl.run.rollout_source``): what a rebuild drops, where it restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.restarted: list[int] = []

    def restart(self, step: int) -> None:
        self.restarted.append(step)


class _State:
    def __init__(self) -> None:
        self.loaded: list[dict] = []
        self.resets = 0

    def load_state_dict(self, state: dict) -> None:
        self.loaded.append(state)

    def reset(self) -> None:
        self.resets += 1


def _run(alive: list[bool], resume_from: str | None = None) -> Run:
    """A ``Run`` without its driver-side set-up: only what ``rebuild`` touches."""
    run = Run.__new__(Run)
    run.session, run.groups, run.resume_from, run.next_step = _Session(alive), {"actor": object()}, resume_from, 7
    run.sync, run.family, run.started = _Sync(), SimpleNamespace(state=_State()), 0
    run.source = _Source()  # the generations in flight (staleness, stream): dropped with the session
    run.checks = StepChecks({}, Limits(max_lag=0, lag_source="", no_signal_steps=10, logprob_kl_max=0.1))

    def start_workers() -> None:
        run.started += 1
        run.session = _Session([True] * len(alive))

    run.start_workers = start_workers
    return run


def _fail_and_rebuild(recovery: Recovery, run: Run, exc: BaseException, step: int) -> int:
    """What the loop does with a failed step."""
    restart = recovery.on_failure(exc, step, run.session)
    run.rebuild(restart.checkpoint, restart.resume_step)
    recovery.rebuilt(restart.resume_step)
    return restart.resume_step


def test_lost_ranks_names_the_dead_ones():
    assert lost_ranks(_Session([True, False, True])) == ["actor[1]"]
    assert lost_ranks(_Session([True, True])) == []


def test_a_real_error_is_reraised_untouched():
    run = _run([True, True])
    error = ValueError("bad reward function")
    recovery = Recovery(3)
    with pytest.raises(ValueError) as err:
        recovery.on_failure(error, 5, run.session)
    assert err.value is error and recovery.phase is Phase.FAILED and run.started == 0
    with pytest.raises(GroupLostError):  # "lost" while every rank answers: no restart loop
        Recovery(3).on_failure(GroupLostError("actor.update: rank 1 was lost"), 5, run.session)


def test_lost_worker_rebuilds_from_the_last_saved_checkpoint(tmp_path, caplog):
    run = _run([True, False])
    old = run.session
    recovery = Recovery(2)
    assert _fail_and_rebuild(recovery, run, GroupLostError("lost"), 7) == 0  # no checkpoint yet: from the start
    assert old.discarded and old.groups == {} and run.started == 1 and run.next_step == 0
    assert run.sync.dropped and run.source.dropped and run.resume_from is None and run.family.state.resets == 1
    assert run.source.restarted == [0]  # the source's pipeline starts again at the rebuilt step
    assert recovery.phase is Phase.RUNNING

    path = save_checkpoint(checkpoint_dir(tmp_path, 4), step=4, params={"w": np.zeros(3, np.float32)},
                           extra={"next_step": 4, "algorithm_state": {"kl_ctrl": {"value": 0.25}},
                                  "checks": {"reward_signal": {"streak": 3}}})
    recovery.saved(path)
    run.session = _Session([False, True])
    with caplog.at_level("WARNING", logger="flowrl.run.recovery"):
        assert _fail_and_rebuild(recovery, run, RuntimeError("Connection closed by peer"), 6) == 4
    assert run.resume_from == path and run.next_step == 4 and recovery.restarts == 2
    assert run.family.state.loaded == [{"kl_ctrl": {"value": 0.25}}]  # the driver's algorithm state goes back too
    assert run.checks.memory["reward_signal"] == {"streak": 3}  # and the checks' memories (issue 32)
    assert any("restart 2/2" in r.getMessage() and "actor[0]" in r.getMessage() and "steps 4..6" in r.getMessage()
               for r in caplog.records)

    run.session = _Session([False, True])  # restarts used up: the error goes out
    error = GroupLostError("lost again")
    with pytest.raises(GroupLostError) as err:
        recovery.on_failure(error, 5, run.session)
    assert err.value is error and run.started == 2 and recovery.phase is Phase.FAILED


def test_max_restarts_zero_fails_at_once():
    run = _run([False])
    with pytest.raises(GroupLostError):
        Recovery(0).on_failure(GroupLostError("lost"), 0, run.session)
    assert run.started == 0


def test_no_session_means_no_restart():
    error = RuntimeError("failed before the workers started")
    with pytest.raises(RuntimeError) as err:
        Recovery(3).on_failure(error, 0, None)
    assert err.value is error

"""A graph built only to be looked at (``run.graph()``) reserves nothing in the workers' call
order until it is submitted (issue 35, item 1): drawing a graph never holds up the next step."""

from __future__ import annotations

import pytest

from flowrl.actors import GroupMesh, Session, WorkerGroup
from flowrl.actors.group import StaleDraft, draft


class _Actor:
    def __init__(self, key: str) -> None:
        self.key = key


def _groups() -> dict[str, WorkerGroup]:
    hybrid = WorkerGroup("actor_rollout_ref", [_Actor("a0")], ["w0"], GroupMesh(dp=1))
    return {"rollout": hybrid.view("rollout", "rollout"), "actor": hybrid.view("actor", "actor"),
            "rm": WorkerGroup("rm", [_Actor("r0")], ["w1"], GroupMesh(dp=1))}


def _build(groups):
    """Three calls on the shared order (gen, update, reshard) and one on the reward model."""
    return [groups["rollout"].reserve(), groups["actor"].reserve(), groups["rollout"].reserve(), groups["rm"].reserve()]


class _Graphs:
    """Stands for the session's graph runner: records what was submitted."""

    def __init__(self):
        self.submitted = []

    def submit(self, outputs, known):
        self.submitted.append(outputs)
        return outputs


def _session(groups) -> Session:
    session = Session(None, None, timeout_s=1.0, startup_timeout_s=1.0)
    session.local_graphs, session.groups = _Graphs(), dict(groups)
    return session


def test_a_draft_gives_its_numbers_back_and_a_later_step_gets_them():
    groups = _groups()
    seqs, made = draft(groups, lambda: _build(groups), lambda built: [object()])
    assert seqs == [1, 2, 3, 1]  # the draft was built with the numbers the next graph would get
    assert _build(groups) == [1, 2, 3, 1]  # run.step() after a drawn graph: nothing to wait for
    assert made.stale()
    with pytest.raises(StaleDraft, match="build it again"):
        made.claim()


def test_a_submitted_draft_takes_its_numbers_then():
    groups = _groups()
    session = _session(groups)
    out = object()
    seqs, made = draft(groups, lambda: _build(groups), lambda built: [out])
    session.hold(made)
    assert session.submit([out]) == [out]  # the notebook's run.session.submit(graph.outputs)
    assert _build(groups) == [4, 5, 6, 2]  # the next step follows the submitted draft


def test_a_draft_overtaken_by_a_step_is_refused_on_submit_not_left_to_hang():
    groups = _groups()
    session = _session(groups)
    out = object()
    _, made = draft(groups, lambda: _build(groups), lambda built: [out])
    session.hold(made)
    _build(groups)  # run.step() built (and submitted) the same step meanwhile
    with pytest.raises(StaleDraft):
        session.submit([out])
    assert session.local_graphs.submitted == []  # nothing reached the workers
    session.hold(draft(groups, lambda: _build(groups), lambda built: [object()])[1])
    assert len(session._drafts) == 1  # stale drafts are not kept


def test_outputs_of_other_graphs_leave_held_drafts_alone():
    groups = _groups()
    session = _session(groups)
    _, made = draft(groups, lambda: _build(groups), lambda built: [object()])
    session.hold(made)
    session.submit([object()])
    assert session._drafts == [made]

"""The weight sync of a hybrid group whose ranks generate with the training parameters
(``WorkerGroup.shares_weights``): a node that calls no rank and reserves no call, reporting what
a sync that moved nothing reports."""

from __future__ import annotations

from flowrl import nodes
from flowrl.actors.dispatch import GroupMesh
from flowrl.actors.group import WorkerGroup
from flowrl.config import load_config
from flowrl.metrics import names


def _views(shares: bool) -> tuple[WorkerGroup, WorkerGroup]:
    fused = WorkerGroup("actor_rollout_ref", actors=[object(), object()], addresses=["a", "b"],
                        mesh=GroupMesh(dp=2), shares_weights=shares)
    return fused.view("actor", "actor"), fused.view("rollout", "rollout")


def test_shared_weights_sync_reserves_no_call_and_reports_zero_bytes(tiny_model_dir):
    cfg = load_config(None, [f"model.path={tiny_model_dir}"])
    actor, rollout = _views(shares=True)
    before = actor.reserve()
    sync = nodes.build_reshard(cfg, actor, rollout, None, step=3)
    assert rollout.reserve() == before + 1  # no sequence number went to the sync: the next gen follows the update
    out = sync.compute(scheduler="sync")
    assert out.metrics[names.RESHARD_BYTES] == 0.0
    assert out.metrics[names.RESHARD_BYTES_MIN] == 0.0  # the same layout: no rank lacks anything
    assert out.metrics[names.RESHARD_PEAK_EXTRA_BYTES] == 0.0
    assert names.timing(names.RESHARD) in out.metrics  # the step still reports its sync


def test_a_group_with_weights_of_its_own_reserves_both_sides_of_the_sync(tiny_model_dir):
    cfg = load_config(None, [f"model.path={tiny_model_dir}"])
    actor, rollout = _views(shares=False)
    before = actor.reserve()
    nodes.build_reshard(cfg, actor, rollout, None, step=3)  # built, not computed (it would call the ranks)
    assert rollout.reserve() == before + 3  # the actor's and the rollout's turn of the reshard

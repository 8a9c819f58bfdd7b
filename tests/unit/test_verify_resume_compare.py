"""The comparisons of ``flowrl verify-resume`` (issue 32 item 5): times are left out, every other
metric must be equal at every step, a resumed run's first step lacks only the previous step's
sync metrics, and two checkpoints differ where a tensor or the optimizer step does."""

from __future__ import annotations

import numpy as np

from flowrl.run.verify_resume import compare_checkpoints, compare_metrics, steady


def _rows():
    return [{"step": s, "critic/score/mean": 0.5 * s, "timing_s/step": 1.0 + s, "actor/pg_loss": -0.1 * s,
             "async/staleness_mean": 1.0, "async/rollout_idle_s": 0.3, "reshard/bytes": 10.0} for s in (1, 2, 3)]


def test_times_are_not_compared_and_the_rest_is():
    assert not steady("timing_s/gen") and not steady("checks/time_s") and not steady("perf/mfu/actor")
    assert steady("critic/score/mean") and steady("async/staleness_max") and not steady("async/queue_depth")
    # a function of the syncs the process saw: a resumed one saw none before its restart
    assert not steady("checks/engine_moved_value") and not steady("checks/engine_moved") and steady("checks/weight_sync")
    ref, got = _rows(), _rows()
    got[2]["timing_s/step"] = 99.0
    del got[2]["reshard/bytes"]  # the resumed process's first step collected no sync
    assert compare_metrics(ref, got, resumed_at=3) == ([], 11)  # 4 steady keys x 3 steps, less the absent sync one
    got[2]["actor/pg_loss"] = -0.31
    diffs, _ = compare_metrics(ref, got, resumed_at=3)
    assert diffs == ["step 3: actor/pg_loss = -0.30000000000000004 uninterrupted, -0.31 resumed"]
    del got[1]["reshard/bytes"]  # but a later step must have it
    assert "step 2: reshard/bytes only in the uninterrupted run" in compare_metrics(ref, got, resumed_at=3)[0]
    assert compare_metrics(ref, got[:1], resumed_at=2)[0][-2:] == ["step 2: missing from the resumed run",
                                                                  "step 3: missing from the resumed run"]


def test_checkpoints_differ_where_a_tensor_or_the_optimizer_step_does(tmp_path):
    from flowrl.checkpoint import save_checkpoint

    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, dtype=np.float32)}
    optim = {"exp_avg": {k: v * 0.1 for k, v in params.items()}}
    a = save_checkpoint(str(tmp_path / "a"), step=2, params=params, optim=optim, extra={"next_step": 2, "optim_step": 2})
    b = save_checkpoint(str(tmp_path / "b"), step=2, params=params, optim=optim, extra={"next_step": 2, "optim_step": 2})
    assert compare_checkpoints(a, b) == ([], 4, 0.0)
    moved = {**params, "b": params["b"] + np.float32(1e-6)}
    c = save_checkpoint(str(tmp_path / "c"), step=2, params=moved, optim=optim, extra={"next_step": 2, "optim_step": 3})
    diffs, n, worst = compare_checkpoints(a, c)
    assert n == 4 and 0 < worst < 2e-6
    assert diffs[0].startswith("parameter b: differs by up to") and diffs[-1] == "checkpoint meta optim_step: 2 uninterrupted, 3 resumed"

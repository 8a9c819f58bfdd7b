"""A checkpoint moves between placements: a run saved under ``cluster.placement=colocated``
resumes under the default (auto -> hybrid: one process per rank) and one saved under hybrid
resumes colocated, each ending where a run that never stopped ends.

Checkpoints hold the trainer's state only (the generation weights are the trainer's, synced or
shared), so a placement is not part of a run's identity (``flowrl.run.run_dir``: the default run
directory of a colocated run is the one an auto run resumes).
"""

from __future__ import annotations

import json

import pytest
import torch

from flowrl.checkpoint import latest_checkpoint, load_full, load_meta
from flowrl.config import load_config
from flowrl.run import train

COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm")
# actor.ppo_mini_batch_size=4 of 8: two optimizer steps per batch, so the trainer computes the
# pre-update log-probs and rollout/logprob_diff_max compares them with the generation's


def _cfg(run_dir, model_dir, data, steps, *extra):
    return load_config(None, [
        f"model.path={model_dir}", f"data.train_files={data[0]}", f"trainer.run_dir={run_dir}",
        "data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=4", "trainer.progress=false",
        f"trainer.total_training_steps={steps}", "trainer.save_freq=2", *extra,
    ])


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(1200)
def test_a_checkpoint_resumes_under_the_other_placement(tmp_path, tiny_model_dir, addition_data):
    a_dir = tmp_path / "uninterrupted"
    a = _cfg(a_dir, tiny_model_dir, addition_data, 4)
    assert a.placement == "hybrid"  # the default, auto
    train(a)
    ca = latest_checkpoint(a_dir / "checkpoints")
    # colocated 2 steps, then resumed by the default (auto -> hybrid); and the uninterrupted hybrid
    # run's own step-2 checkpoint resumed colocated (the hybrid half of that direction is run a)
    for first, then, resumed_as in (("colocated", "auto", "hybrid"), ("hybrid", "colocated", "colocated")):
        b_dir = tmp_path / f"{first}-then-{then}"
        if first == "colocated":
            assert train(_cfg(b_dir, tiny_model_dir, addition_data, 2, f"cluster.placement={first}")).steps == 2
            resume = ()
        else:
            resume = (f"trainer.resume_mode={a_dir / 'checkpoints' / 'step_00000002'}",)
        resumed = _cfg(b_dir, tiny_model_dir, addition_data, 4, f"cluster.placement={then}", *resume)
        assert resumed.placement == resumed_as
        assert train(resumed).steps == 2  # steps 3 and 4, from step 2's checkpoint

        rows_a, rows_b = _rows(a_dir), _rows(b_dir)
        assert [r["step"] for r in rows_b] == ([1, 2, 3, 4] if not resume else [3, 4])  # verl's numbering
        for row in rows_b[-2:]:  # the resumed generation runs on the checkpoint's weights, not the initial ones
            assert row["rollout/logprob_diff_max"] < 1e-4
        for ra, rb in zip(rows_a[-len(rows_b):], rows_b):  # the same run, whichever processes held the ranks
            for key in COMPARED:
                assert ra[key] == pytest.approx(rb[key], rel=1e-5, abs=1e-6), (first, ra["step"], key)
        cb = latest_checkpoint(b_dir / "checkpoints")
        assert load_meta(ca)["extra"]["optim_step"] == load_meta(cb)["extra"]["optim_step"]
        for state in (None, "exp_avg", "exp_avg_sq"):
            pa, pb = load_full(ca, state=state, as_torch=True), load_full(cb, state=state, as_torch=True)
            assert pa.keys() == pb.keys()
            for name in pa:
                torch.testing.assert_close(pa[name], pb[name], rtol=1e-5, atol=1e-6, msg=f"{first} {state} {name}")

"""Exact resume (dp): 4 uninterrupted steps vs 2 steps, then a resume to 4 in the same run dir.

Metrics of steps 2 and 3 and the final checkpoint's parameters and optimizer state must be
bitwise equal (fp32, same layout); each step's experience Parquet exists exactly once.
"""

from __future__ import annotations

import json

import pytest
import torch

from flowrl.checkpoint import latest_checkpoint, load_full, load_meta
from flowrl.config import load_config
from flowrl.run import train

COMPARED = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm")


def _cfg(run_dir, model_dir, data, steps, *extra):
    return load_config(None, [
        f"model.path={model_dir}", f"data.train_files={data[0]}", f"trainer.run_dir={run_dir}",
        "data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=8", "trainer.progress=false",
        f"trainer.total_training_steps={steps}", "trainer.save_freq=2", *extra,
    ])


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(900)
def test_stopped_and_resumed_run_equals_uninterrupted_run(tmp_path, tiny_model_dir, addition_data):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = train(_cfg(a_dir, tiny_model_dir, addition_data, 4))
    b1 = train(_cfg(b_dir, tiny_model_dir, addition_data, 2))
    assert b1.steps == 2
    assert latest_checkpoint(b_dir / "checkpoints").endswith("step_00000002")
    b2 = train(_cfg(b_dir, tiny_model_dir, addition_data, 4, "trainer.resume_mode=auto"))
    assert b2.steps == 2  # steps 2 and 3 only

    rows_a, rows_b = _rows(a_dir), _rows(b_dir)
    assert [r["step"] for r in rows_a] == [1, 2, 3, 4]  # verl's numbering
    assert [r["step"] for r in rows_b] == [1, 2, 3, 4]  # resumed rows appended, none repeated
    for ra, rb in zip(rows_a, rows_b):
        for key in COMPARED:  # exact equality (bitwise through JSON's float repr)
            assert ra[key] == rb[key], (ra["step"], key, ra[key], rb[key])

    ca, cb = latest_checkpoint(a_dir / "checkpoints"), latest_checkpoint(b_dir / "checkpoints")
    assert ca.endswith("step_00000004") and cb.endswith("step_00000004")
    ma, mb = load_meta(ca), load_meta(cb)
    assert ma["extra"]["next_step"] == mb["extra"]["next_step"] == 4
    assert ma["extra"]["optim_step"] == mb["extra"]["optim_step"] == 4
    for state in (None, "exp_avg", "exp_avg_sq"):
        pa, pb = load_full(ca, state=state, as_torch=True), load_full(cb, state=state, as_torch=True)
        assert pa.keys() == pb.keys()
        for name in pa:
            assert pa[name].dtype == torch.float32
            assert torch.equal(pa[name], pb[name]), (state, name)  # bitwise
    # max_ckpt_to_keep=3 keeps both of B's checkpoints
    assert sorted(p.name for p in (b_dir / "checkpoints").iterdir() if p.name.startswith("step_")) == \
        ["step_00000002", "step_00000004"]

    files = sorted(p.name for p in (b_dir / "experience").iterdir())
    assert files == [f"step_{s:06d}.parquet" for s in range(1, 5)], files

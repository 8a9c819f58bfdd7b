"""A resume that equals not stopping (issue 32 item 5): each checkpoint records what a resume
must restore, and the resume refuses a checkpoint whose restored state differs from its record.

One real run of 2 steps saves its checkpoint; each case resumes a copy of its directory for one
more step, with a fault injected into the copy: a changed optimizer state, a changed data position
(``next_step``), changed parameters. The untouched copy resumes with ``resume=ok`` on the health
line; each fault stops the resume before any step with the check's error naming what differs."""

from __future__ import annotations

import json
import shutil

import pytest

from flowrl.checks import CheckFailed
from flowrl.config import load_config
from flowrl.run import train


def _cfg(run_dir, model_dir, data, steps: int, *extra: str):
    return load_config(None, [
        f"model.path={model_dir}", f"data.train_files={data}", f"trainer.run_dir={run_dir}", "data.train_batch_size=4",
        "rollout.n=2", "actor.ppo_mini_batch_size=4", "trainer.progress=false", f"trainer.total_training_steps={steps}",
        "trainer.save_freq=2", "actor.optim.lr=1e-2", *extra])


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_model_dir, addition_data):
    run_dir = tmp_path_factory.mktemp("resume") / "run"
    train(_cfg(run_dir, tiny_model_dir, addition_data[0], 2))
    meta = json.loads((run_dir / "checkpoints" / "step_00000002" / "meta.json").read_text())
    record = meta["extra"]["resume_fingerprint"]
    assert record["optim_step"] == 2 and record["data"]["next_step"] == 2 and len(record["params"]) > 10
    return run_dir


def _optimizer(ckpt):
    import zarr

    group = zarr.open_group(str(ckpt), mode="r+")
    name = sorted(group["optim/exp_avg"].array_keys())[0]
    arr = group[f"optim/exp_avg/{name}"]
    arr[...] = arr[...] + 1.0


def _params(ckpt):
    import zarr

    group = zarr.open_group(str(ckpt), mode="r+")
    arr = group["params/model.layers.0.mlp.up_proj.weight"]
    arr[...] = arr[...] * 0.5


def _data_position(ckpt):
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["extra"]["next_step"] = 1
    (ckpt / "meta.json").write_text(json.dumps(meta))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault, error", [
    (None, None),
    (_optimizer, r"check resume failed at step 0: resume from \S+ does not restore what it saved: optimizer state "
                 r"exp_avg on trainer rank 0: squared norm"),
    (_data_position, r"data position: the run continues at step 1, the checkpoint was saved to continue at step 2"),
    (_params, r"parameters \(1 of \d+: model.layers.0.mlp.up_proj.weight\) differ from those saved"),
], ids=["untouched", "optimizer", "data_position", "parameters"])
def test_a_resume_restores_its_record_or_is_refused(saved, tmp_path, tiny_model_dir, addition_data, fault, error):
    run_dir = tmp_path / "run"
    shutil.copytree(saved, run_dir)
    if fault is not None:
        fault(run_dir / "checkpoints" / "step_00000002")
    cfg = _cfg(run_dir, tiny_model_dir, addition_data[0], 3, "trainer.resume_mode=auto")
    if error is None:
        summary = train(cfg)
        assert summary.steps == 1 and "resume=ok" in summary.health
        return
    with pytest.raises(CheckFailed, match=error):
        train(cfg)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == ([1] if fault is _data_position else [1, 2])  # no step ran after the refused resume
    off = train(_cfg(run_dir, tiny_model_dir, addition_data[0], 3, "trainer.resume_mode=auto", "trainer.checks.resume=off"))
    assert "resume=off" in off.health  # =off skips it (the run goes on from what it restored)

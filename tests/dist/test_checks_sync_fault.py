"""An engine that ignores the weight update, in a real run (issue 32 item 1): every process of a
``flowrl train`` run (driver, forked workers) starts with a ``sitecustomize`` that makes the ``hf``
engine's write target a copy of its weights (the transport writes the copy; the engine keeps
sampling the old weights). With ``trainer.staleness=1`` (a real sync every step) the sync node's
fingerprints name the parameters and the generation rank, and the run stops with the check's
one-line error; the same run without the fault passes (``test_checks_sync_e2e.py``). With the
fingerprints only warning, the probe batch (``trainer.checks.engine_moved``) stops the run.""" 

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SITECUSTOMIZE = '''
import flowrl.backends.generate.hf as _hf

_live = _hf.HFGenerator.reshard_target
_hf.HFGenerator.reshard_target = lambda self: {n: t.clone() for n, t in _live(self).items()}
'''


@pytest.fixture(scope="module")
def default_task():
    from flowrl.run import default_cache_dir
    from flowrl.tasks.default_task import prepare_default_task

    return prepare_default_task(default_cache_dir() / "default_task")


def _train(tmp_path, default_task, injected: bool, *extra: str) -> tuple[subprocess.CompletedProcess, object]:
    fault = tmp_path / "fault"
    fault.mkdir()
    if injected:
        (fault / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fault), os.environ.get("PYTHONPATH", "")])}
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", "train", f"model.path={default_task.model_dir}",
                           f"data.train_files={default_task.train_path}", f"trainer.run_dir={run_dir}",
                           "data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=8",
                           "actor.optim.lr=1e-3", "trainer.total_training_steps=4", "trainer.staleness=1",
                           "trainer.progress=false", *extra], env=env, capture_output=True, text=True, timeout=550)
    return proc, run_dir


@pytest.mark.timeout(600)
@pytest.mark.parametrize("injected", [True, False], ids=["engine_ignores_update", "fault_removed"])
def test_an_engine_that_ignores_the_update_stops_the_run_naming_it(tmp_path, default_task, injected):
    proc, run_dir = _train(tmp_path, default_task, injected)
    if not injected:  # the same run, the engine applying its updates: every sync verified, the probe moving
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "weight_sync=ok" in proc.stdout.splitlines()[-1] and "engine_moved=ok" in proc.stdout.splitlines()[-1]
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["reshard/fingerprint_mismatch"] for r in rows[1:]] == [0.0, 0.0, 0.0]
        return
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert error and error[-1].startswith("error: check weight_sync failed after the weight sync: "), proc.stderr[-3000:]
    assert "parameters differ between the trainer and the generation engine" in error[-1]
    assert "generation rank [0] hold fingerprint" in error[-1] and "engine that did not apply the update" in error[-1]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]  # step 2 collected step 1's sync and stopped


@pytest.mark.timeout(600)
def test_the_probe_names_an_engine_that_ignores_the_update(tmp_path, default_task):
    """The same fault with the fingerprints only warning: the probe batch's log-probs, unchanged
    while the trainer's weights moved, stop the run (trainer.checks.engine_moved=error)."""
    proc, run_dir = _train(tmp_path, default_task, True, "trainer.checks.weight_sync=warn",
                           "trainer.checks.engine_moved=error", "trainer.total_training_steps=3")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert error and error[-1].startswith("error: check engine_moved failed"), proc.stderr[-3000:]
    assert "fixed probe batch did not" in error[-1]

"""The notebook API checks each step as ``flowrl train`` does (issue 32): ``Run.step()`` returns
the checks' metrics with the step's, ``Run.health()`` the health line, and a failed check in
``error`` mode raises ``CheckFailed`` after the step, its table and metrics kept in
``run.last_step`` (the fault: a reward function that scores everything 0, with
``trainer.checks.reward_signal=error`` after 2 steps)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowrl.checks import CheckFailed
from flowrl.config import load_config
from flowrl.run import Run, resolve_inputs

CONSTANT = Path(__file__).resolve().parents[1] / "flowrl_testing" / "constant_reward.py"


@pytest.mark.timeout(300)
def test_run_step_checks_the_step_and_raises_a_failed_error_check(tmp_path, tiny_model_dir, addition_data):
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", f"trainer.run_dir={tmp_path / 'run'}",
        "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4", "trainer.progress=false",
        "trainer.total_training_steps=3", f"algorithm.reward_fn={CONSTANT}:compute_score",
        "trainer.checks.reward_signal=error", "trainer.checks.reward_signal_steps=2"])
    run = Run.open(resolve_inputs(cfg))
    try:
        table, metrics = run.step()  # step 1: no signal for 1 step, not yet 2
        assert metrics["checks/tokens"] == 0.0 and metrics["checks/staleness"] == 0.0
        assert metrics["checks/reward_signal"] == 0.0  # 1 step without signal: not yet 2
        assert "checks/time_s" in metrics and run.health().startswith("health: chat_template=n/a resume=n/a")
        with pytest.raises(CheckFailed, match=r"check reward_signal failed at step 2: no learning signal"):
            run.step()
        table, metrics = run.last_step
        assert metrics["checks/reward_signal"] == 1.0 and table.num_rows == 8
        assert "reward_signal=FAIL" in run.health()
    finally:
        run.close()

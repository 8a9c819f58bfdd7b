"""A real run that checks itself (issue 32): ``train()`` with an injected fault, a reward function
that scores everything 0, stops at the step the ``reward_signal`` check fails
(``trainer.checks.reward_signal_steps=2``: step 2, the last, a checkpoint step), with the named error; the steps before
are logged with every check's metric (the real hash of the generated tokens matched, the rows
were on policy, the rewards finite), the health line is printed, and no checkpoint is saved
for the failed step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowrl.checks import CheckFailed
from flowrl.config import load_config
from flowrl.run import train

CONSTANT = Path(__file__).resolve().parents[1] / "flowrl_testing" / "constant_reward.py"


@pytest.mark.timeout(300)
def test_a_constant_reward_stops_the_run_naming_the_check(tmp_path, tiny_model_dir, addition_data, capsys):
    run_dir = tmp_path / "run"
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"data.train_files={addition_data[0]}", f"trainer.run_dir={run_dir}",
        "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4", "trainer.progress=false",
        "trainer.total_training_steps=2", "trainer.save_freq=2", f"algorithm.reward_fn={CONSTANT}:compute_score",
        "trainer.checks.reward_signal=error", "trainer.checks.reward_signal_steps=2"])
    with pytest.raises(CheckFailed, match=r"check reward_signal failed at step 2: no learning signal: every reward "
                                          r"is 0 for 2 steps in a row \(step 1\.\.2\)"):
        train(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["checks/reward_signal"] for r in rows] == [0.0, 1.0]
    for row in rows:  # the other checks ran on the real tables and passed
        assert row["checks/tokens"] == 0.0 and row["checks/finite"] == 0.0 and row["checks/staleness"] == 0.0
    assert not (run_dir / "checkpoints").exists() or not list((run_dir / "checkpoints").glob("step_*"))
    out = capsys.readouterr().out
    assert "health: chat_template=n/a resume=n/a engine_moved=n/a finite=ok" in out and "reward_signal=FAIL" in out and "tokens=ok" in out

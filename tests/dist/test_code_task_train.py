"""The embedded code task through ``flowrl train`` for two steps (issue 38's smoke test): the
`code` reward runs the policy's one-line functions in the jail and reports its extra values."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flowrl.agents.jail import jail_problem


@pytest.mark.timeout(600)
@pytest.mark.skipif(jail_problem() is not None, reason=f"no jail here: {jail_problem()}")
def test_two_steps_of_the_code_task_score_in_the_jail(tmp_path):
    from flowrl.tasks.warmup import WarmupConfig
    from flowrl.tasks.code_task import prepare_code_task

    warmup = WarmupConfig(max_steps=4, batch_size=8, check_every=10, target_greedy_accuracy=None)  # a smoke test
    task = prepare_code_task(tmp_path / "task", num_train=64, num_test=8, warmup=warmup, target_greedy_accuracy=1.0)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "flowrl.cli", "train", "configs/code_task.yaml", f"model.path={task.model_dir}",
           f"data.train_files={task.train_path}", f"trainer.run_dir={out}", "data.train_batch_size=4", "rollout.n=4",
           "actor.ppo_mini_batch_size=4", "trainer.total_training_steps=2", "trainer.progress=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["reward/compiled"] <= 1.0 and "reward/tests_passed" in r for r in rows)
    import yaml

    assert yaml.safe_load((out / "config.yaml").read_text())["sandbox"]["mode"] == "auto"  # recorded

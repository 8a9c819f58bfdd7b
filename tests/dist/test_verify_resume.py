"""``flowrl verify-resume`` (issue 32 item 5) end to end on the tiny model: 2 + 2 steps, the run
killed with SIGKILL after its checkpoint of step 2 and resumed, equals the run that never stopped,
metric by metric and parameter by parameter, for the default settings (hybrid engine), stream
mode and PPO (a critic) with ``trainer.staleness=1`` (one run for both: the critic's state and the
one-step-old rollout in flight at the checkpoint; they were two runs of ~42 s each). Its comparison,
with a metric or a tensor changed, reports the difference (the pure parts:
``test_verify_resume_compare``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

BASE = ["data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4"]
CASES = {
    "default": [],
    "stream": ["trainer.async_mode=stream", "trainer.staleness=1", "trainer.stream_request_size=2"],
    "ppo_staleness1": ["algorithm.adv_estimator=gae", "actor.use_kl_loss=false", "critic.ppo_mini_batch_size=4",
                       "trainer.staleness=1"],
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_resume_passes(tmp_path, tiny_model_dir, addition_data, case):
    out = tmp_path / "verify"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", "verify-resume", f"model.path={tiny_model_dir}",
                           f"data.train_files={addition_data[0]}", *BASE, *CASES[case], "--steps", "4",
                           "--kill-after", "2", "--out", str(out), "--timeout", "400"],
                          capture_output=True, text=True, timeout=850)
    wall = time.perf_counter() - start
    report = json.loads((out / "verify_resume.json").read_text())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert report["passed"] and report["metrics_compared"] > 100 and report["tensors_compared"] > 20
    assert [p["name"] for p in report["phases"]] == ["uninterrupted", "killed", "resumed"]
    assert report["phases"][1]["returncode"] == -9
    assert "verify-resume PASS" in proc.stdout
    print(f"verify-resume {case}: {wall:.1f}s wall, phases {[round(p['wall_s'], 1) for p in report['phases']]}")

"""The dashboard's health panel (issue 32 item 7): every check's last result for a run directory
written here as a run writes it: ``metrics.jsonl`` with the checks' metrics, ``health.json`` by the
run's own :class:`StepChecks` (a failed check in error mode, one in warn mode, ok, n/a, off), and
the metrics-only reading of a run without ``health.json``."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import yaml

from flowrl.checks import CHECKS, Limits, StepChecks
from flowrl.checks.base import skipped
from flowrl.checks.health_file import HEALTH_FILE, read_health
from flowrl.config.checks import ChecksConfig
from flowrl.data import experience as ex
from flowrl.metrics.dashboard_health import config_modes, from_metrics, run_health
from flowrl.metrics.run_reader import RunReader

LIMITS = Limits(max_lag=1, lag_source="trainer.staleness=1", no_signal_steps=3, logprob_kl_max=0.1)
MODES = {"finite": "error", "reward_time": "warn", "tokens": "off"}


def table(scores=(0.0, 1.0, 1.0, 0.0)) -> pa.Table:
    """Two groups of two one-token responses; advantage = score - group mean (NaN next to an inf)."""
    adv = [[scores[i] - (scores[i - i % 2] + scores[i - i % 2 + 1]) / 2] for i in range(4)]
    return pa.table({"uid": [f"u{i}" for i in range(4)], "group": pa.array([0, 0, 1, 1], pa.int64()),
                     "response_ids": pa.array([[5], [6], [7], [8]], ex.TOKEN_IDS),
                     "score": pa.array(scores, pa.float32()),
                     "token_rewards": pa.array([[s] for s in scores], ex.TOKEN_FLOATS),
                     "advantages": pa.array(adv, ex.TOKEN_FLOATS)})


def states(text: str) -> dict[str, str]:
    """check -> state, as the panel's rows carry them."""
    return dict(re.findall(r"<tr data-check='([^']+)' data-state='([^']+)'>", text))


def write_run(run_dir, *, with_health: bool = True) -> StepChecks:
    """Three steps of a run, each scored slower than generated (reward_time fails at the third:
    warn mode); step 3 with an inf score (finite fails: error mode); ``tokens`` off; metrics as
    the run logs them."""
    run_dir.mkdir()
    # every mode, as the resolved config.yaml writes them (a bare off as YAML's false)
    modes = {**ChecksConfig().modes(), **MODES, "tokens": False}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(
        {"model": {"path": str(run_dir / "no-model")},
         "trainer": {"total_training_steps": 5, "checks": {**modes, "reward_signal_steps": 3}}}))
    checks = StepChecks(MODES, LIMITS, run_dir=run_dir if with_health else None)
    checks.record("chat_template", skipped("single-turn rollouts"))
    slow = {"timing_s/gen": 1.0, "timing_s/reward": 2.0}
    for index, scores in ((0, (0.0, 1.0, 1.0, 0.0)), (1, (0.0, 1.0, 1.0, 0.0)), (2, (0.0, float("inf"), 1.0, 0.0))):
        metrics = {"step": index + 1, "critic/score/mean": 0.5, **checks.observe(index, table(scores=scores), slow)}
        with open(run_dir / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps(metrics) + "\n")
    return checks


def test_panel_lists_every_check_with_its_last_state_and_a_failures_message(tmp_path):
    from flowrl.metrics.dashboard import Dashboard

    run_dir = tmp_path / "run"
    checks = write_run(run_dir)
    assert read_health(run_dir)["step"] == 3
    dash = Dashboard(run_dir)
    text = dash.health.text
    shown = states(text)
    # every check of the run, start checks first, as the health line orders them
    assert list(shown) == ["chat_template", "resume", *CHECKS.names()] == list(checks.results())
    assert shown["finite"] == "failed" and shown["reward_time"] == "warn" and shown["tokens"] == "off"
    assert shown["staleness"] == "ok" and shown["chat_template"] == "n/a" and shown["resume"] == "not run"
    assert shown["logprob_agreement"] == "n/a"  # no log-prob columns in the table
    assert "score has 0 NaN and 1 inf" in text and "scoring took" in text  # the failures' messages
    assert "after step 3, from health.json" in text and "1 failed" in text and "1 warn" in text
    # the health line says the same, in its words
    line = checks.health_line()
    assert "finite=FAIL" in line and "reward_time=WARN" in line and "tokens=off" in line and "resume=-" in line


def test_panel_follows_new_steps_of_a_live_run(tmp_path):
    from flowrl.metrics.dashboard import Dashboard

    run_dir = tmp_path / "run"
    checks = write_run(run_dir)
    dash = Dashboard(run_dir, live=True)
    assert states(dash.health.text)["finite"] == "failed"
    metrics = {"step": 4, **checks.observe(3, table(), {})}  # step 4: healthy again
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps(metrics) + "\n")
    dash.update()
    assert states(dash.health.text)["finite"] == "ok" and "after step 4" in dash.health.text


def read(run_dir) -> RunReader:
    reader = RunReader(run_dir, decode=False)
    reader.refresh()
    return reader


def test_without_health_json_the_panel_reads_the_metrics_and_the_configs_modes(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir, with_health=False)
    assert not (run_dir / HEALTH_FILE).exists()
    health = run_health(read(run_dir))
    shown = {name: state for name, state, _ in health.rows}
    assert health.source == "metrics" and health.step == 3
    assert shown["finite"] == "failed" and shown["reward_time"] == "warn" and shown["tokens"] == "off"
    assert shown["staleness"] == "ok" and shown["logprob_agreement"] == "n/a" and shown["resume"] == "n/a"
    assert config_modes({"trainer": {"checks": {"tokens": False, "finite": "warn", "reward_signal_steps": 3}}}) \
        == {"tokens": "off", "finite": "warn"}


def test_a_health_json_behind_the_metrics_is_not_shown_and_no_run_shows_no_checks(tmp_path):
    from flowrl.metrics.dashboard_health import NO_CHECKS, health_html

    run_dir = tmp_path / "run"
    write_run(run_dir)
    with open(run_dir / "metrics.jsonl", "a") as fh:  # a step whose checks did not write health.json
        fh.write(json.dumps({"step": 4, "checks/finite": 0.0}) + "\n")
    health = run_health(read(run_dir))
    assert health.source == "metrics" and dict((n, s) for n, s, _ in health.rows)["finite"] == "ok"
    assert from_metrics({}, {}).rows == [] and NO_CHECKS in health_html([from_metrics({}, {})], ["run"])

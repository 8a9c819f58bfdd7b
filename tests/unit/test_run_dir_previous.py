"""A rerun that starts afresh (no checkpoint to resume) keeps the earlier run's results in
``previous/<UTC time>/`` instead of overwriting them silently (issue 35, item 8)."""

from __future__ import annotations

from flowrl.run.run_dir import PREVIOUS_DIR, has_results, keep_previous_results


def _earlier_run(run_dir):
    (run_dir / "experience").mkdir(parents=True, exist_ok=True)
    (run_dir / "experience" / "step_000001.parquet").write_bytes(b"x")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    (run_dir / "config.yaml").write_text("trainer: {}\n")
    (run_dir / ".flowrl.lock").write_text("host h pid 1\n")
    (run_dir / "dask-scratch").mkdir(exist_ok=True)


def test_results_move_aside_and_the_lock_stays(tmp_path):
    run_dir = tmp_path / "run"
    _earlier_run(run_dir)
    kept = keep_previous_results(run_dir)
    assert kept is not None and kept.parent == run_dir / PREVIOUS_DIR
    assert sorted(p.name for p in kept.iterdir()) == ["config.yaml", "experience", "metrics.jsonl"]
    assert (kept / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert sorted(p.name for p in run_dir.iterdir()) == [".flowrl.lock", "dask-scratch", PREVIOUS_DIR]
    assert keep_previous_results(run_dir) is None  # nothing left to keep
    _earlier_run(run_dir)  # a third run in the same second: its own folder
    again = keep_previous_results(run_dir)
    assert again is not None and again != kept and (again / "metrics.jsonl").is_file()


def test_a_directory_without_results_is_left_alone(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("trainer: {}\n")
    (run_dir / "metrics.jsonl").write_text("")  # a run that stopped before its first step
    assert not has_results(run_dir)
    assert keep_previous_results(run_dir) is None
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "metrics.jsonl"]

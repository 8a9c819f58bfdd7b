"""The CLI's small stumbling blocks of a newcomer's first hour (issue 35, item 8): ``config
--fields`` filters and survives a closed pipe, ``train --help`` lists keys and points to
``config --fields``, ``export-hf`` of a checkpoint a default run never wrote names the flag."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flowrl.cli import HELP_KEYS, build_parser, main

FLOWRL = [sys.executable, "-m", "flowrl.cli"]


def test_fields_keeps_only_keys_containing_the_filter(capsys):
    assert main(["config", "--fields", "lr"]) == 0
    keys = [line.split(" = ")[0] for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert "actor.optim.lr" in keys and all("lr" in k for k in keys)
    assert main(["config", "--fields", "nosuchkey"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --fields nosuchkey:") and "fix: flowrl config --fields" in err


@pytest.mark.parametrize("args", [["config", "--fields"], ["config", "--fields", "lr"]])
def test_a_closed_pipe_ends_quietly(args):
    """``flowrl config --fields | head``: the reader goes first; no traceback, Unix's status."""
    proc = subprocess.Popen(FLOWRL + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before the first byte: every write meets a closed pipe
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_train_help_lists_the_main_keys_and_points_to_fields():
    text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for key in HELP_KEYS:
        assert f"\n  {key} = " in text, key
    assert "flowrl config --fields" in text
    assert "rollout.n = 16" in text  # with its default


def test_export_of_a_checkpoint_a_run_never_saved_names_save_freq(tmp_path, capsys):
    missing = tmp_path / "runs" / "flowrl" / "x" / "checkpoints" / "step_00000060"
    assert main(["export-hf", str(missing), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no such checkpoint" in err and "trainer.save_freq=" in err


def test_a_slow_default_task_build_says_what_the_wait_is(capsys):
    import time

    from flowrl.run.preflight import _saying_if_slow

    with _saying_if_slow("building", after_s=0.05):
        time.sleep(0.3)  # a first build: the message comes while it runs
    assert capsys.readouterr().err == "building\n"
    with _saying_if_slow("building", after_s=5.0):
        pass  # a cached task: nothing to say
    time.sleep(0.1)
    assert capsys.readouterr().err == ""

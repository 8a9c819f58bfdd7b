"""A damaged checkpoint folder never makes ``trainer.resume_mode=auto`` start over silently (issue
35, item 9): with ``latest`` missing, pointing outside the folder, or a checkpoint's ``meta.json``
corrupt, pre-flight warns naming the damage and the run resumes from the newest intact
checkpoint; with none intact it refuses (a ConfigError naming the damage and the fix)."""

from __future__ import annotations

import json
import logging

import pytest

from flowrl.checkpoint import latest_checkpoint
from flowrl.checkpoint.format import FORMAT, FORMAT_VERSION
from flowrl.checkpoint.loading import checkpoint_damage
from flowrl.config import ConfigError
from flowrl.run.preflight import check_auto_resume


def _checkpoint(root, step: int) -> str:
    path = root / f"step_{step:08d}"
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, "step": step,
                                                "params": {}, "optim": {}}))
    (root / "latest").write_text(path.name)
    return str(path)


@pytest.fixture
def run_dir(tmp_path):
    root = tmp_path / "checkpoints"
    _checkpoint(root, 2)
    _checkpoint(root, 4)
    return tmp_path


def test_intact_folder_is_quiet(run_dir, caplog):
    assert checkpoint_damage(run_dir / "checkpoints") == []
    check_auto_resume(run_dir)
    assert caplog.text == ""


@pytest.mark.parametrize(("damage", "named"), [
    (lambda root: (root / "latest").unlink(), "latest is unreadable (No such file or directory)"),
    (lambda root: (root / "latest").write_text("../../elsewhere"),
     "names '../../elsewhere', which is not a checkpoint directory of"),
    (lambda root: (root / "latest").write_text(".."), "names '..', which is not a checkpoint directory"),
    (lambda root: (root / "latest").write_bytes(b"\xff\xfe"), "latest is unreadable"),
], ids=["latest-missing", "latest-outside", "latest-parent", "latest-garbled"])
def test_bad_latest_resumes_newest_with_warning(run_dir, caplog, damage, named):
    root = run_dir / "checkpoints"
    damage(root)
    with caplog.at_level(logging.WARNING):
        check_auto_resume(run_dir)
    assert named in caplog.text and "resuming from the newest intact checkpoint" in caplog.text
    assert latest_checkpoint(root) == str(root / "step_00000004")


def test_corrupt_meta_resumes_older_with_warning(run_dir, caplog):
    root = run_dir / "checkpoints"
    (root / "step_00000004" / "meta.json").write_text('{"format": "flowrl-checkpoint", "step": ')
    with caplog.at_level(logging.WARNING):
        check_auto_resume(run_dir)
    assert "step_00000004/meta.json is corrupt" in caplog.text
    assert "latest names 'step_00000004'" not in caplog.text  # the pointer is fine; its target is not
    assert caplog.text.rstrip().endswith(str(root / "step_00000002"))
    assert latest_checkpoint(root) == str(root / "step_00000002")


def test_no_intact_checkpoint_refused(tmp_path):
    root = tmp_path / "checkpoints"
    _checkpoint(root, 2)
    meta = json.loads((root / "step_00000002" / "meta.json").read_text())
    (root / "step_00000002" / "meta.json").write_text(json.dumps({**meta, "step": "two"}))
    with pytest.raises(ConfigError) as info:
        check_auto_resume(tmp_path)
    message = str(info.value)
    assert message.startswith("trainer.resume_mode='auto': finds no intact checkpoint in")
    assert "has the step 'two', not a step number; it is corrupt" in message and "trainer.resume_mode=disable" in message


def test_preflight_looks_where_checkpoints_are_saved(tmp_path):
    from flowrl.run.checkpointing import checkpoint_root

    assert checkpoint_root(tmp_path) == tmp_path / "checkpoints"  # check_auto_resume's folder

"""A config file's YAML mistakes are refused at once (issue 35, item 9): a key given twice (YAML
keeps the last silently), an alias bomb (billions of values from a few lines), a file that is not
UTF-8. ``flowrl train CONFIG`` prints one ``error:`` line naming the file, the problem and the
fix, and exits with 2 before reading anything else."""

from __future__ import annotations

import time

import pytest

from flowrl.cli import main

# nine levels of nine aliases: 9**9 strings if expanded
BOMB = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize(("content", "words"), [
    ("trainer:\n  total_training_steps: 5\n  seed: 1\n  total_training_steps: 5000\n",
     ["names the key 'total_training_steps' twice in one mapping (lines 2 and 4)", "keep one of them"]),
    (BOMB, ["expands through its aliases to more than 100,000 values", "write the values out"]),
    ("trainer:\n  project_name: caf\xe9\n".encode("latin-1"),
     ["is not UTF-8 text (byte 0xe9 at offset 28, line 2)", "save the file as UTF-8"]),
], ids=["duplicate-key", "alias-bomb", "not-utf8"])
def test_bad_yaml_refused(tmp_path, capsys, content, words):
    path = tmp_path / "run.yaml"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    start = time.perf_counter()
    rc = main(["train", str(path)])
    wall = time.perf_counter() - start
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"error: CONFIG='{path}': "), err
    for w in words:
        assert w in err[0], err[0]
    assert wall < 2.0, f"{wall:.2f}s"


def test_merge_keys_and_anchors_still_load(tmp_path):
    from flowrl.config.loader import _read_yaml

    path = tmp_path / "ok.yaml"
    path.write_text("\ufeffbase: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 3\n")  # a BOM, a merge key overridden
    assert _read_yaml(path) == {"base": {"x": 1, "y": 2}, "other": {"x": 3, "y": 2}}

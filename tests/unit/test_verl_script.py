"""``flowrl train --verl-script 'run.sh [ARGS]' [overrides]`` (issue 37 item 4): a verl shell script
runs as it is under bash, its ``python3 -m verl.trainer.main_ppo`` call recorded by a stand-in
interpreter first on PATH (:mod:`flowrl.config.verl_script`)."""

from __future__ import annotations

import shlex
import textwrap

import pytest

from flowrl.config import ConfigError, load_config
from flowrl.config.verl_script import capture, expand

# a verl-style script: set -u, a positional default, an environment default, arithmetic, an array,
# a quoted list value, a real python call before verl's (it must still run), a trailing "$@"
SCRIPT = textwrap.dedent('''\
    #!/usr/bin/env bash
    set -xeuo pipefail
    ENGINE=${1:-vllm}
    shift $(( $# > 0 ? 1 : 0 ))
    N=${N:-5}
    gsm8k_train=$HOME/data/gsm8k/train.parquet
    math_train=$HOME/data/math/train.parquet
    train_files="['$gsm8k_train', '$math_train']"
    sizes=(
        data.train_batch_size=$((16 * 2))
        actor_rollout_ref.actor.ppo_mini_batch_size=16
    )
    python3 -c "import sys; sys.exit(0 if 6 * 7 == 42 else 3)"
    python3 -m verl.trainer.main_ppo \\
        algorithm.adv_estimator=grpo \\
        data.train_files="$train_files" \\
        "${sizes[@]}" \\
        actor_rollout_ref.rollout.name=$ENGINE \\
        actor_rollout_ref.rollout.n=$N \\
        trainer.logger='["console"]' "$@"
    echo "after verl"
''')


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/user")
    monkeypatch.delenv("N", raising=False)
    path = tmp_path / "run_qwen.sh"
    path.write_text(SCRIPT)
    return path


def test_the_script_runs_as_it_is_and_its_main_ppo_list_is_recorded(script):
    assert capture(f"{script} hf trainer.total_epochs=2", env={"N": "4"}) == [
        "algorithm.adv_estimator=grpo",
        "data.train_files=['/home/user/data/gsm8k/train.parquet', '/home/user/data/math/train.parquet']",
        "data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=4", 'trainer.logger=["console"]',
        "trainer.total_epochs=2",
    ]
    assert "actor_rollout_ref.rollout.name=vllm" in capture(str(script))  # the script's own default


def test_overrides_after_the_script_win(script):
    argv = expand(["train", "--verl-script", f"{shlex.quote(str(script))} hf", "actor_rollout_ref.rollout.n=2",
                   "trainer.total_epochs=3"])
    assert argv[0] == "train" and argv[-2:] == ["actor_rollout_ref.rollout.n=2", "trainer.total_epochs=3"]
    assert "actor_rollout_ref.rollout.n=5" in argv  # the script's, earlier
    cfg = load_config(None, argv[1:])
    assert cfg.rollout.n == 2 and cfg.trainer.total_epochs == 3 and cfg.rollout.name == "hf"
    assert cfg.data.train_batch_size == 32 and cfg.trainer.logger == ["console"]
    assert cfg.data.train_files == "/home/user/data/gsm8k/train.parquet,/home/user/data/math/train.parquet"
    assert expand(["train", f"--verl-script={script}"])[1:] == capture(str(script))
    assert expand(["train", "a=1"]) == ["train", "a=1"]  # no flag: unchanged


def test_a_script_that_does_not_call_main_ppo_once_is_refused_by_name(tmp_path):
    cases = {
        "none.sh": ("echo nothing here\n", "without calling python3 -m verl.trainer.main_ppo"),
        "fails.sh": ("echo broken >&2; exit 7\npython3 -m verl.trainer.main_ppo a=1\n", "exited 7 (broken)"),
        "twice.sh": ("python3 -m verl.trainer.main_ppo a=1\npython3 -m verl.trainer.main_ppo a=2\n", "2 times"),
    }
    for name, (body, problem) in cases.items():
        (tmp_path / name).write_text(body)
        with pytest.raises(ConfigError, match="--verl-script") as err:
            capture(str(tmp_path / name))
        assert problem in err.value.problem, (name, err.value)
    with pytest.raises(ConfigError, match="is not a file"):
        capture(str(tmp_path / "missing.sh"))
    (tmp_path / "hangs.sh").write_text("sleep 30\n")
    with pytest.raises(ConfigError, match="ran past 1 s"):
        capture(str(tmp_path / "hangs.sh"), timeout_s=1)


def test_flowrl_config_runs_a_verl_script_from_the_command_line(script, tmp_path, capsys):
    """``flowrl config --verl-script ...`` as a user types it: the script's list, then the overrides."""
    from flowrl.cli import main

    assert main(["config", "--verl-script", f"{shlex.quote(str(script))} hf", "trainer.total_epochs=3"]) == 0
    out = capsys.readouterr().out
    assert "total_epochs: 3" in out and "name: hf" in out
    assert main(["config", "--verl-script", str(tmp_path / "missing.sh")]) == 2
    assert "--verl-script" in capsys.readouterr().err

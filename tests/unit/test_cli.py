"""The CLI's cheap entry points (train itself is covered in tests/dist/test_grpo_e2e.py)."""

import subprocess
import sys

import flowrl
from flowrl.cli import main


def test_version(capsys):
    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert flowrl.__version__ in capsys.readouterr().out


def test_python_dash_c_prints_version():
    out = subprocess.run([sys.executable, "-c", "import flowrl; print(flowrl.__version__)"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == flowrl.__version__


def test_config_prints_resolved_yaml(capsys):
    assert main(["config", "rollout.n=3"]) == 0
    out = capsys.readouterr().out
    assert "rollout:" in out and "n: 3" in out


def test_config_error_exit_code(capsys):
    assert main(["config", "rollout.temperature=-1"]) == 2
    assert "rollout.temperature" in capsys.readouterr().err


def test_parallel_plan_subcommand(capsys):
    assert main(["parallel-plan", "--model", "7B", "--gpus", "16", "--top", "2"]) == 0
    assert "tp" in capsys.readouterr().out
    assert main(["parallel-plan", "--model", "7B", "--gpus", "0"]) == 2


def test_reshard_plan_subcommand(capsys):
    assert main(["reshard-plan", "--train", "tp=4,pp=2", "--gen", "tp=2"]) == 0
    out = capsys.readouterr().out
    assert "naive" in out.lower()
    assert main(["reshard-plan", "--train", "tp=3", "--gen", "tp=1"]) == 2

"""trainer.logger: config validation, the sinks it opens, TensorBoard event files."""

import math
from pathlib import Path
import subprocess
import sys

import pytest

from flowrl.config import ConfigError, load_config
from flowrl.metrics import ConsoleLogger, open_loggers, read_metrics


def test_logger_list_override_parses_from_the_command_line_syntax():
    assert load_config().trainer.logger == ["console"]
    cfg = load_config(None, ["trainer.logger=[console,tensorboard]"])
    assert cfg.trainer.logger == ["console", "tensorboard"]
    assert load_config(None, ["trainer.logger=[]"]).trainer.logger == []


@pytest.mark.parametrize("override, key, value, fix", [
    ("trainer.logger=[console,nosuch]", "trainer.logger", "nosuch", "use one of console, jsonl, tensorboard, wandb"),
    # a logger verl has and flowrl lacks is refused as that missing feature (issue 37)
    ("trainer.logger=[console,swanlab]", "trainer.logger", ["console", "swanlab"], "use one of console, jsonl, tensorboard, wandb"),
    ("trainer.logger=[console,console]", "trainer.logger", ["console", "console"], "list each logger once"),
])
def test_bad_logger_names_the_key_value_and_fix(override, key, value, fix):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.key == key and err.value.value == value and fix in err.value.fix


def test_a_string_logger_is_a_list_of_one_as_in_verl():
    assert load_config(None, ["trainer.logger=console"]).trainer.logger == ["console"]


def test_cli_rejects_an_unknown_logger_before_any_worker():
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", "config", "trainer.logger=[console,nosuch]"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "trainer.logger='nosuch'" in proc.stderr and "tensorboard" in proc.stderr


def test_metrics_jsonl_is_written_whatever_the_logger_list(tmp_path):
    logger = open_loggers([], tmp_path, total=2)
    logger.log(0, {"critic/score/mean": 0.5, "actor/pg_loss": float("nan")})
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 0, "actor/pg_loss": None, "critic/score/mean": 0.5}]


def test_console_logger_prints_one_line_per_step():
    lines = []
    logger = ConsoleLogger(3, lines.append)
    logger.log(0, {"val-core/flowrl/addition/reward/mean@1": 0.125, "timing_s/validation": 0.5})  # val_before_train
    logger.log(1, {"critic/score/mean": 0.25, "timing_s/step": 1.5})  # verl's numbering: the first step is 1
    logger.log(2, {"critic/score/mean": 0.5})
    assert lines == ["step 0/3  val-core/flowrl/addition/reward/mean@1=0.125", "step 1/3  score=0.250  step_s=1.500",
                     "step 2/3  score=0.500"]


def test_tensorboard_event_files_hold_every_finite_scalar(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    (tmp_path / "run").mkdir()
    lines = []
    logger = open_loggers(["console", "tensorboard"], tmp_path / "run", total=2, write=lines.append,
                          project="proj", experiment="exp")
    logger.log(1, {"critic/score/mean": 0.25, "actor/pg_loss": -1.5, "actor/kl_loss": math.inf})
    logger.log(2, {"critic/score/mean": 0.75, "actor/pg_loss": -0.5, "actor/kl_loss": 0.125})
    logger.close()
    board = tmp_path / "tensorboard_log" / "proj" / "exp"  # verl's place, under the working directory
    assert lines == [f"tensorboard: tensorboard --logdir {Path('tensorboard_log/proj/exp')}",
                     "step 1/2  score=0.250  pg_loss=-1.500  kl=inf", "step 2/2  score=0.750  pg_loss=-0.500  kl=0.125"]
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
    acc = EventAccumulator(str(board))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"critic/score/mean", "actor/pg_loss", "actor/kl_loss"}
    score = [(e.step, e.value) for e in acc.Scalars("critic/score/mean")]
    assert score == [(1, 0.25), (2, 0.75)]  # the same steps as metrics.jsonl
    assert [(e.step, e.value) for e in acc.Scalars("actor/kl_loss")] == [(2, 0.125)]  # inf skipped


def test_tensorboard_dir_is_verls(tmp_path, monkeypatch):
    from flowrl.metrics.logger import tensorboard_dir

    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    assert tensorboard_dir("p", "e") == Path("tensorboard_log/p/e")
    assert tensorboard_dir("../..", "a/b") == Path("tensorboard_log/_/a_b")  # never outside tensorboard_log
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    assert tensorboard_dir("p", "e") == tmp_path / "tb"


def test_missing_tensorboard_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    with pytest.raises(ConfigError) as err:
        open_loggers(["tensorboard"], tmp_path, total=1)
    assert err.value.key == "trainer.logger" and "pip install tensorboard" in err.value.fix
    assert (tmp_path / "metrics.jsonl").is_file()  # opened first, closed on the error


def test_jsonl_a_step_logged_again_replaces_its_rows(tmp_path):
    # a notebook cell run twice (or a resumed run) logs steps 0..2 again: each stays once
    from flowrl.metrics.logger import JsonlLogger, read_metrics

    path = tmp_path / "metrics.jsonl"
    for _ in range(2):
        logger = JsonlLogger(path)
        for step in range(3):
            logger.log(step, {"critic/score/mean": float(step)})
        logger.close()
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2]
    logger = JsonlLogger(path)  # resumed at step 2: steps 0 and 1 kept, 2 replaced
    logger.log(2, {"critic/score/mean": 9.0})
    logger.close()
    assert [(r["step"], r["critic/score/mean"]) for r in read_metrics(path)] == [(0, 0.0), (1, 1.0), (2, 9.0)]

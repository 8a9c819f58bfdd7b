"""Metric sinks (``trainer.logger``): ``metrics.jsonl``, the console line, TensorBoard, wandb.

``metrics.jsonl`` (one JSON object per step) is always written: the dashboard, resume and the
run summary read it. Every sink numbers steps as verl does: training steps from 1, validation
before training at step 0. ``console`` prints one line per step; ``tensorboard`` writes event
files where verl's does, ``$TENSORBOARD_DIR`` or else ``tensorboard_log/<project>/<experiment>``
relative to the working directory (:func:`tensorboard_dir`); ``wandb`` logs to Weights & Biases
under ``trainer.project_name`` / ``trainer.experiment_name``, online when ``wandb.init`` would
find credentials (``WANDB_API_KEY``, ``~/.netrc`` from ``wandb login``, wandb's settings),
offline (files under ``<run_dir>/wandb``) without, and as ``WANDB_MODE`` says when it is set
(:func:`wandb_mode`). :func:`open_loggers` builds the sinks a config names.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any, Callable, Iterable

from flowrl.metrics import names

#: The keys shown on the console line, in order, with their short labels.
CONSOLE_KEYS = (
    (names.SCORE_MEAN, "score"),
    (names.ACTOR_PG_LOSS, "pg_loss"),
    (names.ACTOR_KL_LOSS, "kl"),
    (names.ACTOR_ENTROPY, "entropy"),
    (names.ACTOR_GRAD_NORM, "grad"),
    (names.RESPONSE_LENGTH_MEAN, "resp_len"),
    (names.THROUGHPUT, "tok/s"),
    (names.STEP_TIME, "step_s"),
)


class JsonlLogger:
    """Appends one JSON object per step; flushed at once so a crash loses no finished step.

    The first step logged replaces the file's rows of that step and later ones (a run resumed, a
    notebook cell run again): a step is never in the file twice."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.touch()  # the run's metrics file exists from the start (kept as it is until a step logs)
        self._fh: IO[str] | None = None
        self._closed = False

    def log(self, step: int, metrics: dict[str, float]) -> None:
        assert not self._closed, "logger closed"
        if self._fh is None:
            drop_rows_from(self.path, step)
            self._fh = open(self.path, "a")
        row = {"step": step, **{k: _finite(v) for k, v in sorted(metrics.items())}}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._closed = True
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def drop_rows_from(path: Path, step: int) -> None:
    """Keep only the rows of a per-step JSONL file (``metrics.jsonl``, ``timeline.jsonl``) of
    steps before ``step`` (the rest are run again)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] < step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


def _finite(v: float) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def read_metrics(path: str | Path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def console_line(step: int, total: int, metrics: dict[str, float]) -> str:
    """``step 3/60  score=0.41  ...`` (verl's step: 1 .. total; validation before training is
    step 0), then the validation means (``val-core/<data_source>/.../mean@n``) when the row has them."""
    parts = [f"step {step}/{total}"]
    shown = [(key, label) for key, label in CONSOLE_KEYS if key in metrics]
    shown += [(key, key) for key in sorted(metrics) if key.startswith(VAL_CORE) and "/mean@" in key]
    for key, label in shown:
        v = metrics[key]
        parts.append(f"{label}={v:.3f}" if abs(v) < 1000 else f"{label}={v:.0f}")
    return "  ".join(parts)


VAL_CORE = "val-core/"
"""verl's prefix of the validation metrics a run is judged by (``val-core/<data_source>/...``)."""


class ConsoleLogger:
    """One line per step (:func:`console_line`) through ``write`` (``print``, or a progress
    bar's ``write`` so the line does not break the bar)."""

    def __init__(self, total: int, write: Callable[[str], None] = print) -> None:
        self.total, self.write = total, write

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.write(console_line(step, self.total, metrics))

    def close(self) -> None:
        pass


class TensorBoardLogger:
    """Scalars to TensorBoard event files under ``log_dir`` (x axis: the step as logged, verl's
    1-based step, as the ``step`` of metrics.jsonl). Non-finite values are skipped, as JSONL
    writes them as null."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            from flowrl.config import ConfigError

            raise ConfigError("trainer.logger", "tensorboard", f"needs the tensorboard package ({exc})",
                              "pip install tensorboard, or drop tensorboard from trainer.logger") from exc
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in sorted(metrics.items()):
            v = _finite(value)
            if v is not None:
                self._writer.add_scalar(key, v, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def tensorboard_dir(project: str, experiment: str) -> Path:
    """Where verl's ``tensorboard`` logger writes: ``$TENSORBOARD_DIR``, else
    ``tensorboard_log/<project>/<experiment>`` relative to the working directory (verl's
    ``verl/utils/tracking.py``), so ``tensorboard --logdir tensorboard_log`` shows every run."""
    import os
    import re

    def safe(part: str) -> str:  # no path separators or dot-dot from a name (as the run directory's)
        return re.sub(r"[^A-Za-z0-9_.+-]", "_", part).strip(".") or "_"

    return Path(os.environ.get("TENSORBOARD_DIR") or Path("tensorboard_log") / safe(project) / safe(experiment))


def wandb_mode(wandb: Any) -> tuple[str, str]:
    """(mode, why) for ``wandb.init``: ``WANDB_MODE`` as the user set it; else ``online`` when
    wandb finds credentials where ``wandb.init`` looks (``WANDB_API_KEY``, wandb's settings,
    ``~/.netrc`` or ``$NETRC``; checked without a prompt and without the network), else
    ``offline`` (``wandb.init`` would stop to ask, or fail without a terminal)."""
    import os

    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"], "WANDB_MODE"
    try:
        found = bool(wandb.login(prompt=False, verify=False))
    except TypeError:  # a wandb without login(prompt=...): its own lookup
        found = bool(getattr(getattr(wandb, "api", None), "api_key", None))
    if found:
        return "online", "wandb credentials found"
    return "offline", "no wandb credentials (wandb login, or WANDB_API_KEY)"


class WandbLogger:
    """Scalars to Weights & Biases (verl's ``wandb`` logger), in the mode of :func:`wandb_mode`;
    offline runs upload later with ``wandb sync <run_dir>/wandb/offline-run-*``."""

    def __init__(self, run_dir: str | Path, *, project: str, name: str, config: dict | None = None,
                 write: Callable[[str], None] = print) -> None:
        try:
            import wandb
        except ImportError as exc:
            from flowrl.config import ConfigError

            raise ConfigError("trainer.logger", "wandb", f"needs the wandb package ({exc})",
                              "pip install wandb, or drop wandb from trainer.logger") from exc
        mode, why = wandb_mode(wandb)
        hint = f"; upload later with wandb sync {Path(run_dir) / 'wandb'}/offline-run-*" if mode == "offline" else ""
        write(f"wandb: {mode} ({why}){hint}")
        self._run = wandb.init(project=project, name=name or Path(run_dir).name, dir=str(run_dir), mode=mode,
                               config=config or {}, reinit="finish_previous")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log({k: v for k, v in metrics.items() if _finite(v) is not None}, step=step)

    def close(self) -> None:
        self._run.finish()


class MetricLoggers:
    """Several sinks behind one ``log``/``close``."""

    def __init__(self, sinks: list) -> None:
        self.sinks = sinks

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_loggers(names: Iterable[str], run_dir: str | Path, *, total: int,
                 write: Callable[[str], None] = print, project: str = "flowrl", experiment: str = "",
                 config: dict | None = None) -> MetricLoggers:
    """The sinks ``trainer.logger`` names, always with ``metrics.jsonl`` first. ``write`` prints
    the console line; ``project``, ``experiment`` (empty: the run directory's name) and ``config``
    go to wandb and name the TensorBoard directory. An unknown name raises
    :class:`~flowrl.config.ConfigError`."""
    from flowrl.config import ConfigError
    from flowrl.config.sections import LOGGERS

    run_dir = Path(run_dir)
    sinks: list = [JsonlLogger(run_dir / "metrics.jsonl")]
    try:
        for name in dict.fromkeys(names):
            if name == "console":
                sinks.append(ConsoleLogger(total, write))
            elif name == "tensorboard":
                board = TensorBoardLogger(tensorboard_dir(project, experiment or run_dir.name))
                write(f"tensorboard: tensorboard --logdir {board.log_dir}")
                sinks.append(board)
            elif name == "wandb":
                sinks.append(WandbLogger(run_dir, project=project, name=experiment, config=config, write=write))
            elif name != "jsonl":  # jsonl: always on
                raise ConfigError("trainer.logger", name, "is not a logger", f"use any of {', '.join(LOGGERS)}")
    except BaseException:
        MetricLoggers(sinks).close()
        raise
    return MetricLoggers(sinks)

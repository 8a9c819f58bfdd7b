"""The run directory: derived from the run's identity, so the same command finds its own again.

``trainer.run_dir`` empty: ``runs/<project_name>/<experiment_name>`` under the current directory
(verl's ``checkpoints/{project_name}/{experiment_name}``); without an ``experiment_name``,
``runs/<project_name>/<adv_estimator>-<hash>``, the hash of the run's *identity*: every resolved
setting that shapes the numbers (model, data, algorithm, every group's settings, ``trainer.seed``),
none of those that only say how long, where or how observably it runs (``run_identity``). So an
identical command -- or one that only raises ``trainer.total_training_steps``, changes the
loggers, the cluster or a micro-batch size -- lands in the same directory and, with
``trainer.resume_mode=auto``, resumes from its newest complete checkpoint.

A directory that already holds a run (its ``config.yaml``) of a *different* identity -- only
possible with an explicit ``trainer.run_dir`` or ``trainer.experiment_name`` -- is resumed all the
same, as verl does with ``resume_mode=auto`` (a fixed reward module, a changed learning rate after
a crash: the user's call), but not silently: a warning names the differing keys before any
worker starts. For a separate run: another ``trainer.run_dir`` / ``trainer.experiment_name``;
to start afresh in it: ``trainer.resume_mode=disable``.

A run directory is held by one run at a time (:class:`RunDirLock`: ``.flowrl.lock``, an
``fcntl.flock`` the system releases when the holder exits, killed or not, naming its host and
pid): a second run on it is refused at once, naming the holder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from flowrl.config import ConfigError, RunConfig, to_dict

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"

#: Keys that do not change a run's numbers: how long it runs, where, what it records.
_RUN_CONTROL = (
    "trainer.run_dir", "trainer.resume_mode", "trainer.total_training_steps", "trainer.total_epochs",
    "trainer.save_freq", "trainer.max_ckpt_to_keep", "trainer.max_restarts", "trainer.test_freq",
    "trainer.val_before_train", "trainer.logger", "trainer.progress", "trainer.save_experience",
    "trainer.cache_dir", "trainer.project_name", "trainer.experiment_name", "trainer.save_on_signal",
    "trainer.file_mode",
    "data.val_files", "data.val_max_samples",
    "rollout.gpu_memory_utilization", "rollout.free_cache_engine", "rollout.enforce_eager",
    "rollout.max_num_batched_tokens", "rollout.enable_chunked_prefill", "rollout.reshard_transport",
    "rollout.reshard_bucket_mb", "model.enable_gradient_checkpointing",
)
_RUN_CONTROL_PREFIXES = ("cluster.", "rollout.val_kwargs.", "actor.fsdp_config.", "ref.fsdp_config.",
                         "critic.fsdp_config.")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a (resolved, nested-dict) config that shape a run's numbers."""
    flat = flatten(config)
    return {k: v for k, v in flat.items()
            if k not in _RUN_CONTROL and not k.startswith(_RUN_CONTROL_PREFIXES) and "micro_batch_size" not in k}


def default_run_dir(cfg: RunConfig) -> Path:
    """``runs/<project>/<experiment>``, or ``runs/<project>/<estimator>-<identity hash>``."""
    t = cfg.trainer
    name = t.experiment_name
    if not name:
        blob = json.dumps(run_identity(to_dict(cfg)), sort_keys=True, default=str)
        name = f"{cfg.algorithm.adv_estimator}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"
    return Path("runs") / _safe(t.project_name or "flowrl") / _safe(name)


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", part).strip(".") or "_"


def check_writable(run_dir: Path) -> None:
    """``run_dir`` is (or can be made) a writable directory; what this check creates goes again."""
    created: list[Path] = []
    try:
        missing = [p for p in [run_dir, *run_dir.parents] if not p.exists()]
        for p in reversed(missing):
            p.mkdir()
            created.append(p)
        if not run_dir.is_dir():
            raise NotADirectoryError(f"{run_dir} is not a directory")
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".flowrl-write-test-"):
            pass
    except OSError as exc:
        raise ConfigError("trainer.run_dir", str(run_dir), f"is not a writable directory ({exc.strerror or exc})",
                          "point trainer.run_dir at a directory you can write") from None
    finally:
        for p in reversed(created):
            try:
                p.rmdir()
            except OSError:
                pass


def config_differences(cfg: RunConfig, run_dir: Path) -> list[str]:
    """``"key: old -> new"`` for each identity setting in which ``cfg`` differs from the run
    ``run_dir`` holds (its ``config.yaml``); empty when there is none or it is the same run."""
    import yaml

    try:
        old = yaml.safe_load((run_dir / CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(old, dict):
        return []
    mine, theirs = run_identity(to_dict(cfg)), run_identity(old)
    differ = sorted(k for k in mine.keys() & theirs.keys() if _norm(mine[k]) != _norm(theirs[k]))
    return [f"{k}: {theirs[k]!r} -> {mine[k]!r}" for k in differ]


def warn_if_another_run(cfg: RunConfig, run_dir: Path) -> list[str]:
    """With ``resume_mode=auto``, warn (naming the keys) when ``run_dir`` holds a run of another
    configuration, which this run will resume; returns the differences."""
    if cfg.trainer.resume_mode != "auto":
        return []
    differ = config_differences(cfg, run_dir)
    if differ:
        more = f" and {len(differ) - 6} more" if len(differ) > 6 else ""
        log.warning("trainer.run_dir=%s holds a run of another configuration (%s%s); resuming it as "
                    "trainer.resume_mode=auto says (as verl does). For a separate run use another trainer.run_dir "
                    "or trainer.experiment_name; to start afresh there, trainer.resume_mode=disable",
                    run_dir, ", ".join(differ[:6]), more)
    return differ


def _norm(value: Any) -> Any:
    return [_norm(v) for v in value] if isinstance(value, (list, tuple)) else value


def resolve_run_dir(cfg: RunConfig) -> Path:
    """The absolute run directory of ``cfg`` (given or derived), checked writable; a warning when it
    holds a run of another configuration."""
    run_dir = Path(os.path.expanduser(cfg.trainer.run_dir)) if cfg.trainer.run_dir else default_run_dir(cfg)
    run_dir = run_dir.resolve()
    check_writable(run_dir)
    warn_if_another_run(cfg, run_dir)
    return run_dir


LOCK_FILE = ".flowrl.lock"
_HELD: dict[Path, RunDirLock] = {}  # this process's locks by lock file


class RunDirLock:
    """``run_dir`` held by this process (:data:`LOCK_FILE`, ``fcntl.flock``): taken at once or a
    ConfigError naming the holder's host and pid; released by :meth:`release` or, whatever
    happens, when the process is gone (so a killed run's directory is taken over by the next)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None
        earlier = _HELD.get(self.path)
        if earlier is not None and earlier._fd is not None:  # a Run of this process never closed (a notebook)
            log.warning("trainer.run_dir=%s: taking it over from an earlier Run of this process that was not "
                        "closed (close a Run with run.close())", run_dir)
            self._fd, earlier._fd = earlier._fd, None
            _HELD[self.path] = self
            return
        try:
            taken = self._take()
        except OSError as exc:  # a file system without locks (some network mounts): run unguarded
            log.warning("trainer.run_dir=%s: cannot lock %s (%s); nothing stops a second run from writing "
                        "into it", run_dir, self.path, exc.strerror or exc)
            self.release(unlink=False)
            return
        if not taken:
            holder = self._holder()
            raise ConfigError("trainer.run_dir", str(run_dir), f"is in use by another run ({holder})",
                              "wait for that run to end (or stop it), or give this run its own trainer.run_dir "
                              "or trainer.experiment_name")
        _HELD[self.path] = self
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"host {socket.gethostname()} pid {os.getpid()} since "
                           f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())

    def _take(self) -> bool:
        """Lock the lock file (True), or False while another process holds it. Retried when the
        file was removed by a holder that just let go (the lock would be on a file no longer there)."""
        for _ in range(5):
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.release(unlink=False)
                return False
            try:
                if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                    return True
            except FileNotFoundError:
                pass
            self.release(unlink=False)
        raise OSError(f"{self.path} keeps being replaced")

    def _holder(self) -> str:
        try:
            text = self.path.read_text().strip()
        except (OSError, UnicodeDecodeError):
            text = ""
        return text or "a process that has not written its name yet"

    def release(self, *, unlink: bool = True) -> None:
        """Let the directory go (the lock file too, once unlocked); a second call does nothing."""
        if self._fd is None:
            return
        if _HELD.get(self.path) is self:
            del _HELD[self.path]
        if unlink:
            try:  # remove while still holding the lock: no other run has opened it meanwhile and locked it
                self.path.unlink()
            except OSError:
                pass
        os.close(self._fd)
        self._fd = None


PREVIOUS_DIR = "previous"
"""``<run_dir>/previous/<UTC time>/``: the results of an earlier run a fresh start would overwrite."""
_KEEP_IN_PLACE = {PREVIOUS_DIR, "dask-scratch"}  # and hidden entries (the lock)
_RESULTS = ("metrics.jsonl", "experience", "validation", "checkpoints")


def has_results(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds what a run produced: a logged step, experience, validation
    samples or checkpoints (a ``config.yaml`` alone is not a result)."""
    for name in _RESULTS:
        path = run_dir / name
        if path.is_file() and path.stat().st_size > 0 or path.is_dir() and any(path.iterdir()):
            return True
    return False


def keep_previous_results(run_dir: Path) -> Path | None:
    """A run that starts from step 1 (no checkpoint to resume, or ``trainer.resume_mode=disable``)
    in a directory holding an earlier run's results moves them (every entry but the lock, the
    Dask scratch space and earlier ``previous/``) to ``previous/<UTC time>/`` and returns that
    folder; None when there was nothing to keep. verl starts such a run afresh too; flowrl's
    run directory holds files verl writes elsewhere, and they are not overwritten silently."""
    if not has_results(run_dir):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    target = run_dir / PREVIOUS_DIR / stamp
    for n in range(1, 100):
        if not target.exists():
            break
        target = run_dir / PREVIOUS_DIR / f"{stamp}-{n}"
    target.mkdir(parents=True)
    for entry in sorted(run_dir.iterdir()):
        if entry.name not in _KEEP_IN_PLACE and not entry.name.startswith("."):
            os.rename(entry, target / entry.name)
    return target

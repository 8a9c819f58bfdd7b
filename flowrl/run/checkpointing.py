"""A run's checkpoints: where they live, which one a run resumes from, saving and restoring.

The actor's checkpoint completes a step: ``checkpoints/step_XXXXXXXX`` (zarr, written atomically
by the actor's ranks through ``PolicyRole.save_checkpoint``; ``meta.json`` carries ``next_step``,
the config and the family's driver state). Every other trainable group the family declares
(``family.checkpointed_groups``, e.g. the PPO critic) is saved first, under
``<group>_checkpoints/step_XXXXXXXX``, so a complete step always has all of its parts. The
rollout group gets the actor's parameters on restore.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from flowrl.actors import Gather, Scatter, WorkerGroup
from flowrl.config import RunConfig, to_dict

log = logging.getLogger(__name__)


def checkpoint_root(run_dir: str | Path) -> Path:
    """Where a run's (actor) checkpoints live."""
    return Path(run_dir) / "checkpoints"


def group_checkpoint_root(run_dir: str | Path, group: str) -> Path:
    """Where a run's checkpoints of trainable group ``group`` live (``critic_checkpoints``)."""
    return Path(run_dir) / f"{group}_checkpoints"


def find_resume(cfg: RunConfig, run_dir: Path) -> str | None:
    """The checkpoint ``trainer.resume_mode`` selects (checked before any worker starts)."""
    from flowrl.backends.preflight import check_checkpointable
    from flowrl.checkpoint import latest_checkpoint
    from flowrl.run.preflight import check_resume_path

    mode = cfg.trainer.resume_mode
    if mode == "disable":
        return None
    if mode == "auto":
        found = latest_checkpoint(checkpoint_root(run_dir))
        if found is not None:
            check_checkpointable(cfg, "trainer.resume_mode", f"{mode} (found {found})")
        return found
    return str(check_resume_path(cfg, mode))


def resume_point(path: str) -> tuple[int, dict]:
    """(the step a checkpoint continues at, the family's driver state saved with it)."""
    from flowrl.checkpoint import load_meta

    meta = load_meta(path)
    extra = meta.get("extra", {})
    return int(extra.get("next_step", meta["step"])), extra.get("algorithm_state", {})


def checks_state(path: str) -> dict:
    """The checks' memories a checkpoint saved (``extra["checks"]``; ``{}``: none)."""
    from flowrl.checkpoint import load_meta

    return (load_meta(path).get("extra") or {}).get("checks", {})


def save(cfg: RunConfig, groups: dict[str, WorkerGroup], *, run_dir: Path, step: int,
         trainable: tuple[str, ...], algorithm_state: dict, stream_state: dict | None = None,
         resume_record: dict | None = None, checks_state: dict | None = None) -> str:
    """Save the state after ``step`` finished steps: each group of ``trainable`` first, then the
    actor (which marks the step complete); prune to ``trainer.max_ckpt_to_keep``. Returns the
    actor checkpoint's path. Call between steps. ``stream_state``: the stream mode's weight
    version and queue (``extra["stream"]``, see ``flowrl.run.stream``). ``resume_record``: what a
    resume must restore (``extra["resume_fingerprint"]``, :mod:`flowrl.checks.resume`);
    ``checks_state``: the checks' multi-step memories (``extra["checks"]``)."""
    from flowrl.checkpoint import checkpoint_dir, prune_checkpoints

    start = time.perf_counter()
    keep = cfg.trainer.max_ckpt_to_keep
    for name in trainable:
        root = group_checkpoint_root(run_dir, name)
        groups[name].bind().run("save_checkpoint", gather_mode=Gather.FIRST,
                                kwargs={"path": str(checkpoint_dir(root, step)), "step": step, "extra": {}})
        prune_checkpoints(root, keep)
    extra = {"next_step": step, "config": to_dict(cfg), **({"algorithm_state": algorithm_state} if algorithm_state else {}),
             **({"stream": stream_state} if stream_state is not None else {}),
             **({"resume_fingerprint": resume_record} if resume_record is not None else {}),
             **({"checks": checks_state} if checks_state else {})}
    root = checkpoint_root(run_dir)
    out, _ = groups["actor"].bind().run("save_checkpoint", gather_mode=Gather.FIRST,
                                        kwargs={"path": str(checkpoint_dir(root, step)), "step": step, "extra": extra})
    prune_checkpoints(root, keep)
    log.info("saved %s over %d actor ranks (%.1fs)", out["path"], groups["actor"].world_size, time.perf_counter() - start)
    return out["path"]


def restore(groups: dict[str, WorkerGroup], path: str, *, run_dir: Path, trainable: tuple[str, ...]) -> None:
    """Checkpoint ``path`` into every actor rank (parameters and optimizer), every rollout rank
    (parameters) and each group of ``trainable`` (its own checkpoint of the same step). Call
    right after the groups start, before any graph."""
    from flowrl.checkpoint import checkpoint_dir, load_full, load_meta

    step = int(load_meta(path)["step"])
    for name in trainable:
        _restore_group(groups[name], checkpoint_dir(group_checkpoint_root(run_dir, name), step), name)
    groups["actor"].bind().run("load_checkpoint", kwargs={"path": str(path)})
    groups["rollout"].bind().run("load_hf_state", load_full(path, as_torch=True), scatter_mode=Scatter.BROADCAST)


def _restore_group(group: WorkerGroup, path: Any, name: str) -> None:
    from flowrl.checkpoint import load_meta

    try:
        load_meta(path)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"resuming needs the {name}'s checkpoint {path}: {exc}; start fresh "
                           "(trainer.resume_mode=disable) or restore that directory") from exc
    group.bind().run("load_checkpoint", kwargs={"path": str(path)})

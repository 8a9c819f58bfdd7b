"""Checkpoints of a trainable role (policy, critic), by the engine's checkpoint kind.

Every rank of the group is called. ``full`` engines (``CheckpointKind.FULL``) hold the whole state on every rank: rank 0
writes it with :func:`flowrl.checkpoint.save_checkpoint` (parameters, AdamW's ``exp_avg`` /
``exp_avg_sq`` by HF name, ``extra`` plus ``optim_step``), and on load every rank reads the full
arrays. ``sharded`` engines write and read their own chunks
(:class:`~flowrl.backends.interfaces.ShardedCheckpointEngine`).
"""

from __future__ import annotations

from typing import Any

from flowrl.catalog.backends import CheckpointKind

__all__ = ["load", "save"]


def _with_optim_step(extra: dict, optim_step: int) -> dict:
    """``extra`` with ``optim_step`` right after ``next_step`` (first when there is none): the
    key order of the run's ``meta.json``."""
    out = {k: extra[k] for k in ("next_step",) if k in extra}
    out["optim_step"] = optim_step
    out.update((k, v) for k, v in extra.items() if k != "next_step")
    return out


def save(engine: Any, kind: CheckpointKind | None, path: str, *, rank: int, step: int, extra: dict) -> dict | None:
    """Checkpoint ``path`` of ``engine`` (every rank calls it); ``{"path", "optim_step"}`` on
    rank 0, None elsewhere."""
    if kind is CheckpointKind.SHARDED:
        return engine.save_checkpoint_sharded(path, step=step, extra=extra)
    _check_kind(kind)
    if rank != 0:
        return None
    from flowrl.checkpoint import save_checkpoint

    state = engine.checkpoint_state()
    optim_step = int(state["optim_step"])
    final = save_checkpoint(path, step=step, params=state["params"], optim=state["optim"],
                            extra=_with_optim_step(extra, optim_step))
    return {"path": final, "optim_step": optim_step}


def load(engine: Any, kind: CheckpointKind | None, path: str) -> int:
    """Restore checkpoint ``path`` into ``engine`` (every rank calls it); the optimizer step."""
    if kind is CheckpointKind.SHARDED:
        return engine.load_checkpoint_sharded(path)
    _check_kind(kind)
    from flowrl.checkpoint import load_full, load_meta

    meta = load_meta(path)
    params = load_full(path, as_torch=True)
    optim = {state: load_full(path, state=state, as_torch=True) for state in meta["optim"]}
    optim_step = int(meta.get("extra", {}).get("optim_step", 0))
    engine.load_checkpoint(params, optim, optim_step)
    return optim_step


def _check_kind(kind: CheckpointKind | None) -> None:
    if kind is not CheckpointKind.FULL:
        raise NotImplementedError(f"checkpoint kind {kind!r}: this backend cannot save or restore checkpoints "
                                  "(refused in pre-flight: flowrl.backends.preflight)")

"""A resume that equals not stopping (issue 32 item 5): what a checkpoint must restore, recorded
when it is saved and checked when a run resumes from it.

The record (``meta.json``'s ``extra["resume_fingerprint"]``, :func:`record`) holds

- ``params``: the actor's parameters, a fingerprint per parameter (:mod:`flowrl.checks.fingerprint`,
  of the HF state, so any layout gives the same numbers), taken from the live trainer;
- ``optim_step`` and ``optim_norms``: the optimizer's step and the squared norm of each of its
  states (``exp_avg``, ``exp_avg_sq``) per trainer rank, with the ``layout`` they were taken in;
- ``data``: the data position (the step the run continues at and a hash of that step's prompt
  batch, so other data files, another seed or shuffle show too) and ``seed``;
- ``stream`` (the stream mode's weight version and queue) and ``family`` (the family's driver
  state), as hashes.

No RNG state is recorded because none is carried across steps: the driver draws from no global
generator (a step's prompts are ``np.random.default_rng([trainer.seed, epoch])``'s permutation,
:meth:`flowrl.data.prompts.PromptDataset.batch`; the generation seed is a function of
``trainer.seed``, the step and the round, ``graphs/pieces.py``'s ``gen_seed``; the engines seed
each call with it), so ``seed`` and ``data`` above cover every draw. A digest of the process's
``random`` / numpy / torch global states would compare states nothing reads and that no
checkpoint restores, and refuse correct resumes.

After the groups are restored (``Run.start_workers``) the same record is taken from the live
state and compared (:func:`compare`): a difference is the check ``resume``'s failure, naming each
field that differs (``trainer.checks.resume=error`` refuses the resume). The pure part here
compares records; :func:`engine_state` runs on each trainer rank.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Mapping

from flowrl.checks.base import Verdict, skipped

KEY = "resume_fingerprint"
"""Where a checkpoint's ``meta.json`` keeps the record (under ``extra``)."""
RTOL = 1e-9


def digest(obj: Any) -> str:
    """A short stable hash of a JSON-able object (keys sorted)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def batch_digest(prompts: Any) -> str:
    """A hash of a step's prompt batch (its token ids; a table, or whatever the dataset gives)."""
    if hasattr(prompts, "column_names") and "prompt_ids" in prompts.column_names:
        return digest(prompts.column("prompt_ids").to_pylist())
    if hasattr(prompts, "to_pylist"):
        return digest(prompts.to_pylist())
    return digest(repr(prompts))


def engine_state(engine: Any, rank: int, *, sharded: bool) -> dict:
    """One trainer rank's part of the record: the parameters' fingerprints (rank 0, of the HF
    state; every rank takes part in gathering it), the optimizer's step and its states' squared
    norms over the tensors this rank holds. ``sharded``: the engine's checkpoint kind is
    ``sharded`` (FSDP, megatron), whose ranks each hold a part: every rank then takes part in the
    gather (an FSDP engine also has a collective ``checkpoint_state``, which rank 0 alone must not
    call: it waited on the others forever)."""
    from flowrl.checks.fingerprint import WHOLE, state_fingerprints

    if not sharded:  # full-state engines (dp): rank 0 holds everything
        state = engine.checkpoint_state() if rank == 0 else None
        params = state["params"] if state is not None else None
        optim = state["optim"] if state is not None else {}
        step = int(state["optim_step"]) if state is not None else None
        norms = {name: sum(float(t.double().pow(2).sum()) for t in by_param.values()) for name, by_param in optim.items()}
    else:  # sharded engines: gathered parameters, local optimizer states
        params = engine.hf_state_dict()
        norms, step = _local_optimizer_norms(getattr(engine, "optimizer", None))
    out: dict[str, Any] = {"optim_norms": norms, "optim_step": step}
    if rank == 0 and params is not None:
        out["params"] = {n: list(v[WHOLE]) for n, v in state_fingerprints(params).items()}
    return out


def _torch_states(optimizer: Any) -> list[Mapping] | None:
    """The per-parameter state dicts of a torch optimizer, or of those a wrapper chains
    (megatron-core's ``ChainedOptimizer.chained_optimizers``, each promoting its inner torch
    optimizer's ``state``); None for an optimizer without them."""
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is not None:
        parts = [_torch_states(o) for o in chained]
        return None if any(p is None for p in parts) else [m for p in parts for m in p]
    try:
        state = getattr(optimizer, "state", None)
    except AttributeError:  # a wrapper's promoted property without its inner optimizer
        return None
    return [state] if isinstance(state, Mapping) else None


def _local_optimizer_norms(optimizer: Any) -> tuple[dict[str, float], int | None]:
    """Squared norms of a torch optimizer's states over the tensors this rank holds (a DTensor's
    local shard), and its step; ({}, None) for an optimizer without torch's per-parameter
    ``state`` dict (nothing of it is compared then)."""
    import torch

    states = _torch_states(optimizer)
    if states is None:
        return {}, None
    norms: dict[str, float] = {}
    step = None
    for per_param in (pp for state in states for pp in state.values()):
        if not isinstance(per_param, Mapping):
            return {}, None
        for name, t in per_param.items():
            if not torch.is_tensor(t):
                continue
            local = t.to_local() if hasattr(t, "to_local") else t
            if name == "step":
                step = int(local.item())
            else:
                norms[name] = norms.get(name, 0.0) + float(local.double().pow(2).sum())
    return norms, step


LAYOUT_KEYS = ("strategy", "data_parallel_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
               "virtual_pipeline_model_parallel_size", "use_distributed_optimizer", "ulysses_sequence_parallel_size")
"""What decides which optimizer-state slices a trainer rank holds (the per-rank norms compare
only between records of the same layout)."""


def layout_key(group_cfg: Any, world_size: int) -> str:
    """A trainer group's layout as the record names it: its strategy, world size and every
    parallel size it sets (megatron's expert sizes too)."""
    parts = [f"{k}={getattr(group_cfg, k)}" for k in LAYOUT_KEYS if hasattr(group_cfg, k)]
    megatron = getattr(group_cfg, "megatron", None)
    parts += [f"{k}={getattr(megatron, k)}" for k in ("expert_model_parallel_size", "expert_tensor_parallel_size")
              if hasattr(megatron, k)]
    return f"x{world_size} " + " ".join(parts)


def _trainer(per_rank: list[dict | None], layout: str) -> dict:
    ranks = [r or {} for r in per_rank]
    return {"params": ranks[0].get("params", {}), "optim_step": ranks[0].get("optim_step"),
            "optim_norms": [r.get("optim_norms", {}) for r in ranks], "layout": layout}


def record(per_rank: list[dict | None], *, layout: str, next_step: int, batch: str, seed: int,
           stream: Any, family: Any, critic: list[dict | None] | None = None, critic_layout: str = "") -> dict:
    """The record of a checkpoint (or of a resumed run's live state) from the trainer ranks'
    :func:`engine_state` (rank order), the critic's ranks' (PPO; under ``critic``) and the
    driver's state."""
    out = {**_trainer(per_rank, layout), "data": {"next_step": next_step, "batch": batch}, "seed": seed,
           "stream": digest(stream) if stream is not None else None, "family": digest(family)}
    if critic is not None:
        out["critic"] = _trainer(critic, critic_layout)
    return out


def _close(a: float, b: float, scale: float) -> bool:
    return abs(a - b) <= RTOL * max(scale, abs(a), abs(b)) + 1e-30


def compare(saved: Mapping[str, Any] | None, live: Mapping[str, Any], path: str) -> Verdict:
    """The resumed run's live record against its checkpoint's: ok, or each field that differs."""
    if not saved:
        return skipped(f"{path} records no resume fingerprint (saved by an older flowrl)")
    diffs = _trainer_diffs(saved, live, "")
    if saved.get("critic") is not None:  # PPO's critic (records saved before it have none)
        diffs += _trainer_diffs(saved["critic"], live.get("critic") or {}, "critic ")
    params_saved = saved.get("params", {})
    d_saved, d_live = saved.get("data", {}), live.get("data", {})
    if d_saved.get("next_step") != d_live.get("next_step"):
        diffs.append(f"data position: the run continues at step {d_live.get('next_step')}, the checkpoint was "
                     f"saved to continue at step {d_saved.get('next_step')} (meta.json's next_step was changed?)")
    elif d_saved.get("batch") != d_live.get("batch"):
        diffs.append(f"data position: the prompts of step {d_live.get('next_step')} differ from those the checkpoint "
                     "recorded (data.train_files, data.shuffle or trainer.seed changed since it was saved)")
    if saved.get("seed") != live.get("seed"):
        diffs.append(f"trainer.seed {live.get('seed')}, saved with {saved.get('seed')} (every sampling seed differs)")
    if saved.get("stream") != live.get("stream"):
        diffs.append("the stream mode's weight version and queue restored differ from those saved")
    if saved.get("family") != live.get("family"):
        diffs.append("the family's driver state restored differs from the one saved")
    if diffs:
        return Verdict(False, float(len(diffs)), f"resume from {path} does not restore what it saved: " + "; ".join(diffs))
    critic = f", the critic's {len(saved['critic'].get('params', {}))} and its optimizer" if saved.get("critic") else ""
    return Verdict(True, 0.0, f"{len(params_saved)} parameters, the optimizer{critic}, data position and driver state "
                   "restored")


def _trainer_diffs(saved: Mapping[str, Any], live: Mapping[str, Any], who: str) -> list[str]:
    """What differs of one trainer's record (the actor's, ``who`` empty, or the critic's)."""
    diffs: list[str] = []
    params_saved, params_live = saved.get("params", {}), live.get("params", {})
    wrong = [n for n, (f, s) in params_saved.items()
             if n not in params_live or not _close(f, params_live[n][0], s)]
    if wrong:
        diffs.append(f"{who}parameters ({len(wrong)} of {len(params_saved)}: {', '.join(wrong[:3])}) differ from "
                     "those saved (the checkpoint's weights were changed, or a restore that loaded other weights)")
    if saved.get("optim_step") != live.get("optim_step"):
        diffs.append(f"{who}optimizer step {live.get('optim_step')} restored, {saved.get('optim_step')} saved")
    if saved.get("layout") == live.get("layout"):
        for rank, (a, b) in enumerate(zip(saved.get("optim_norms", []), live.get("optim_norms", []))):
            for name in sorted(set(a) | set(b)):
                if name not in a or name not in b or not _close(a[name], b[name], 0.0):
                    diffs.append(f"{who}optimizer state {name} on trainer rank {rank}: squared norm "
                                 f"{b.get(name, math.nan):.9g} restored, {a.get(name, math.nan):.9g} saved")
    return diffs


def stream_position(state: Mapping[str, Any] | None) -> dict | None:
    """What a resume restores of the stream mode (``RolloutStream.state_dict``): the rollout's
    weight version and the first request it generates (the queue's first, which a resume
    generates again, else the next one); None without a stream."""
    if state is None:
        return None
    first = state["queue"][0][:2] if state.get("queue") else state["next"]
    return {"weight_version": state["weight_version"], "first": list(first)}

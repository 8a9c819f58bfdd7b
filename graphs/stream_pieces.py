"""Partial rollouts in stream mode (``trainer.partial_rollout``): a request as a chain of pieces.

    piece 0  = generate n responses per prompt, at most partial_rollout_tokens each   on rollout
    piece p  = continue the unfinished ones by as many tokens, one sample per row      on rollout
    last     = + the scoring of ``flowrl.graphs.pieces.score``

This is the default :meth:`flowrl.graphs.family.Family.rollout_piece` (the pieces of
:func:`flowrl.graphs.pieces.rollout`); the run calls the family, never this module. Each piece is
a graph of its own that the run submits when it reserves it (``flowrl.run.stream``): a weight
sync reserved between two pieces reaches the rest of the request's responses. Rows carry ``weight_version`` (their first token's) and
``weight_version_max`` (their last token's). Node names: ``gen_p<piece>[_r<round>]``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.checks.tokens import with_response_hash
from flowrl.graphs import pieces
from flowrl.graphs.base import BuildContext
from flowrl.metrics import names
from flowrl.nodes import NodeOut, node

PIECE_SEED_STRIDE = 7919
"""Piece ``p`` of a request is seeded ``p`` strides from its first piece."""


def _piece_name(piece: int, round: int) -> str:
    return f"gen_p{piece}" + (f"_r{round}" if round else "")


def _piece_sampling(cfg: Any) -> Any:
    from dataclasses import replace

    from flowrl.roles.specs import rollout_sampling

    return replace(rollout_sampling(cfg), max_new_tokens=min(cfg.trainer.partial_rollout_tokens, cfg.rollout.response_length))


@lru_cache(maxsize=8)
def _eos_ids(model_dir: str) -> tuple[int, ...]:
    from flowrl.roles.partial import generation_eos_ids

    return tuple(generation_eos_ids(model_dir))


def first_piece(ctx: BuildContext, prompts: pa.Table, *, step: int, round: int, weight_version: int) -> Any:
    """Piece 0 of a request: ``rollout.n`` responses per prompt, at most ``partial_rollout_tokens`` long."""
    seed = pieces.gen_seed(ctx.cfg, step, round)
    return node(_piece_name(0, round), _generate_piece, ctx.groups["rollout"].bind(), prompts, seed=seed,
                sampling=_piece_sampling(ctx.cfg), weight_version=weight_version, what=_piece_name(0, round), step=step)


def next_piece(ctx: BuildContext, previous: Any, *, step: int, round: int, piece: int, weight_version: int,
               last: bool) -> Any:
    """Piece ``piece`` of a request (``previous``: the future of the piece before); scored when ``last``."""
    cfg = ctx.cfg
    seed = pieces.gen_seed(cfg, step, round) + piece * PIECE_SEED_STRIDE
    out = node(_piece_name(piece, round), _continue_piece, ctx.groups["rollout"].bind(), previous, seed=seed,
               sampling=_piece_sampling(cfg), eos_ids=list(_eos_ids(cfg.model.path)),
               response_length=cfg.rollout.response_length, weight_version=weight_version,
               what=_piece_name(piece, round), step=step)
    return pieces.score(ctx, out, step=step, round=round) if last else out


def _generate_piece(rollout: Any, prompts: pa.Table, *, seed: int, sampling: Any, weight_version: int,
                    what: str) -> NodeOut:
    table, compute_s = rollout.run("generate", prompts, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT,
                                   kwargs={"seed": seed, "sampling": sampling})
    version = pa.array([weight_version] * table.num_rows, pa.int64())
    table = table.append_column("weight_version", version).append_column("weight_version_max", version)
    return NodeOut(with_response_hash(table), {names.compute(what): compute_s})  # the tokens check's hash


def _continue_piece(rollout: Any, table: pa.Table, *, seed: int, sampling: Any, eos_ids: list[int],
                    response_length: int, weight_version: int, what: str) -> NodeOut:
    out, compute_s = rollout.run("continue_generation", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT,
                                 kwargs={"seed": seed, "sampling": sampling, "eos_ids": eos_ids,
                                         "response_length": response_length, "weight_version": weight_version})
    return NodeOut(with_response_hash(out), {names.compute(what): compute_s})  # of the response so far

"""Partial rollouts (``trainer.partial_rollout``, stream mode): responses generated in pieces.

A request's first piece is an ordinary ``generate`` with a budget of
``trainer.partial_rollout_tokens`` new tokens; each later piece continues the responses that
have neither stopped (their last token is an EOS) nor reached ``rollout.response_length``, one
sample per row, from the prompt and the response so far (the engine recomputes the KV cache, as
AReaL and verl's partial rollouts do on resume). A weight update reserved between two pieces
therefore reaches the rest of the response: the row's ``weight_version`` stays the version of
its first token, ``weight_version_max`` becomes that of its last. The rollout's log-probs of each
piece are those of the weights that sampled it, which is what the off-policy correction needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from flowrl.backends.interfaces import SamplingParams
from flowrl.data import experience


def unfinished(responses: list[list[int]], eos_ids: set[int], response_length: int) -> list[int]:
    """Rows whose response may go on: shorter than ``response_length`` and not ended by an EOS."""
    return [i for i, r in enumerate(responses) if len(r) < response_length and not (r and r[-1] in eos_ids)]


def continue_responses(engine: Any, table: pa.Table, *, params: SamplingParams, seed: int, eos_ids: list[int],
                       response_length: int, micro_batch_size: int, weight_version: int) -> pa.Table:
    """``table`` with its unfinished responses (:func:`unfinished`) extended by up to
    ``params.max_new_tokens`` tokens (never past ``response_length``), their log-probs and mask
    extended alike, and ``weight_version_max`` set to ``weight_version`` on the rows that grew."""
    responses = table.column("response_ids").to_pylist()
    logprobs = table.column("rollout_logprobs").to_pylist()
    versions = (table.column("weight_version_max") if "weight_version_max" in table.column_names
                else table.column("weight_version")).to_pylist()
    todo = unfinished(responses, set(eos_ids), response_length)
    if todo:
        prompts = table.column("prompt_ids").to_pylist()
        room = max(response_length - len(responses[i]) for i in todo)
        one = dataclasses.replace(params, n=1, max_new_tokens=min(params.max_new_tokens, room))
        new, new_lp = engine.generate([prompts[i] + responses[i] for i in todo], one, seed=seed,
                                      micro_batch_size=micro_batch_size)
        for i, r, lp in zip(todo, new, new_lp):
            left = response_length - len(responses[i])
            responses[i] = responses[i] + list(r[:left])
            logprobs[i] = logprobs[i] + list(lp[:left])
            versions[i] = weight_version
    return experience.with_columns(
        table,
        response_ids=experience.from_lists(responses, experience.TOKEN_IDS),
        response_mask=experience.from_lists([[1] * len(r) for r in responses], pa.list_(pa.int8())),
        rollout_logprobs=experience.from_lists(logprobs, experience.TOKEN_FLOATS),
        weight_version_max=pa.array(versions, pa.int64()),
    )


def generation_eos_ids(model_dir: str) -> list[int]:
    """The EOS ids generation stops at (the engines' rule, :func:`flowrl.backends.interfaces.eos_token_ids`)."""
    from flowrl.backends.interfaces import eos_token_ids

    return eos_token_ids(model_dir)

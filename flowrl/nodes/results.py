"""The step's result node: the final experience table and its data metrics (verl's names),
plus the critic's when the batch has values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from flowrl.data import experience
from flowrl.metrics import names
from flowrl.nodes.core import NodeOut


def collect(table: pa.Table, *_after: Any) -> NodeOut:
    """The step's result: the final experience table and its data metrics (verl's names)."""
    return NodeOut(table, data_metrics(table))


def collect_with_values(table: pa.Table, *after: Any) -> NodeOut:
    """:func:`collect` plus the critic's metrics (:func:`value_metrics`)."""
    out = collect(table, *after)
    out.metrics.update(value_metrics(table))
    return out


def data_metrics(table: pa.Table) -> dict[str, float]:
    """Score, lengths and token counts of the batch; advantages and the engine/trainer log-prob
    gap when the table has them."""
    score = table.column("score").to_numpy()
    resp = experience.lengths(table, "response_ids")
    prompt = experience.lengths(table, "prompt_ids")
    out = {
        names.SCORE_MEAN: float(score.mean()),
        names.SCORE_MAX: float(score.max()),
        names.SCORE_MIN: float(score.min()),
        names.RESPONSE_LENGTH_MEAN: float(resp.mean()),
        names.RESPONSE_LENGTH_MAX: float(resp.max()),
        names.RESPONSE_LENGTH_MIN: float(resp.min()),
        names.PROMPT_LENGTH_MEAN: float(prompt.mean()),
        names.NUM_SAMPLES: float(table.num_rows),
        names.NUM_RESPONSE_TOKENS: float(resp.sum()),
        names.NUM_TOKENS: float(resp.sum() + prompt.sum()),
    }
    if "advantages" in table.column_names:
        adv, _ = experience.token_column(table, "advantages")
        if adv.numel():
            out.update({names.ADVANTAGES_MEAN: float(adv.mean()), names.ADVANTAGES_MAX: float(adv.max()),
                        names.ADVANTAGES_MIN: float(adv.min())})
    if "rollout_logprobs" in table.column_names and "old_logprobs" in table.column_names:
        a, _ = experience.token_column(table, "rollout_logprobs")
        b, _ = experience.token_column(table, "old_logprobs")
        if a.numel():
            gap = (a - b).abs().double().numpy()
            out[names.ROLLOUT_LOGPROB_DIFF_MAX] = float(gap.max())
            out[names.ROLLOUT_LOGPROB_DIFF_P99] = float(np.quantile(gap, 0.99))
            out[names.ROLLOUT_LOGPROB_DIFF_MEAN] = float(gap.mean())
    return out


def value_metrics(table: pa.Table) -> dict[str, float]:
    """The critic's data metrics (verl's names): values, returns and the explained variance of
    the returns by the values the advantages used, over valid tokens; none without ``values``."""
    from flowrl.algos import explained_variance

    if "values" not in table.column_names:
        return {}
    values_T, _ = experience.token_column(table, "values")
    returns_T, _ = experience.token_column(table, "returns")
    mask_T, _ = experience.token_column(table, "response_mask")
    keep_T = mask_T.bool()
    if not bool(keep_T.any()):
        return {}
    v, r = values_T[keep_T], returns_T[keep_T]
    return {
        names.VALUES_MEAN: float(v.mean()), names.VALUES_MAX: float(v.max()), names.VALUES_MIN: float(v.min()),
        names.RETURNS_MEAN: float(r.mean()), names.RETURNS_MAX: float(r.max()), names.RETURNS_MIN: float(r.min()),
        names.VF_EXPLAINED_VAR: explained_variance(values_T, returns_T, mask_T),
    }

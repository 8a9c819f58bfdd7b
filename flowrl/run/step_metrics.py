"""The metrics of a finished step that verl computes from the whole batch and the step's timings
(``verl/trainer/ppo/metric_utils.py``: ``compute_data_metrics``, ``compute_timing_metrics``,
``compute_throughout_metrics``, and the trainer's ``training/*``), where flowrl's nodes do not
already: pure functions of the step's experience table, its metrics and the config's sizes.

Definitions, as verl's (a sample's *length* is its count of real tokens):

- ``critic/rewards/{mean,max,min}``: per sample, the sum of its ``token_rewards`` (the score
  less any KL-in-reward penalty), over samples with a response (verl leaves out aborted ones);
- ``critic/returns/{mean,max,min}``: ``returns`` over every response token with mask 1;
- ``response_length/clip_ratio``: the fraction of samples whose response is
  ``rollout.response_length`` tokens long (verl: the padded width of its response tensor);
- ``prompt_length/{max,min,clip_ratio}``: likewise with ``data.max_prompt_length``;
- ``timing_per_token_ms/<node>``: ``timing_s/<node>`` * 1000 per token: response tokens for
  ``gen``, prompt + response tokens for ``ref``, ``values``, ``adv``, ``update_critic``,
  ``update_actor``;
- ``perf/total_num_tokens``: prompt + response tokens of the batch;
- ``training/global_step``: the step's number (1 for the first); ``training/epoch``: the 0-based
  pass over the prompts the step's batch comes from (``epoch_steps`` batches per pass).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flowrl.metrics import names


def driver_metrics(index: int, wall_s: float, num_tokens: float, steps_per_epoch: int) -> dict[str, float]:
    """The driver's metrics of step ``index`` (0-based; logged as step ``index + 1``)."""
    return {names.STEP_TIME: wall_s, names.THROUGHPUT: num_tokens / wall_s, names.TIME_PER_STEP: wall_s,
            names.TOTAL_NUM_TOKENS: num_tokens, names.GLOBAL_STEP: float(index + 1),
            names.EPOCH: float(index // max(1, steps_per_epoch))}


def batch_metrics(table: Any, *, max_prompt_length: int, max_response_length: int) -> dict[str, float]:
    """verl's data metrics the result node does not write (see the module docstring); those
    whose columns the table lacks are left out."""
    from flowrl.data import experience

    columns = set(table.column_names)
    out: dict[str, float] = {}
    if "prompt_ids" in columns and table.num_rows:
        prompt = experience.lengths(table, "prompt_ids")
        out.update({names.PROMPT_LENGTH_MAX: float(prompt.max()), names.PROMPT_LENGTH_MIN: float(prompt.min()),
                    names.PROMPT_LENGTH_CLIP_RATIO: float(np.mean(prompt == max_prompt_length))})
    if "response_ids" not in columns or not table.num_rows:
        return out
    response = experience.lengths(table, "response_ids")
    out[names.RESPONSE_LENGTH_CLIP_RATIO] = float(np.mean(response == max_response_length))
    if "token_rewards" in columns:
        rewards_T, cu = experience.token_column(table, "token_rewards")
        running = np.concatenate([[0.0], np.cumsum(rewards_T.double().numpy())])
        bounds = cu.numpy()
        sums = (running[bounds[1:]] - running[bounds[:-1]])[response > 0]  # verl leaves out aborted samples
        if sums.size:
            out.update({names.REWARDS_MEAN: float(sums.mean()), names.REWARDS_MAX: float(sums.max()),
                        names.REWARDS_MIN: float(sums.min())})
    if "returns" in columns and "response_mask" in columns:
        returns_T, _ = experience.token_column(table, "returns")
        mask_T, _ = experience.token_column(table, "response_mask")
        valid = returns_T[mask_T.bool()]
        if valid.numel():
            out.update({names.RETURNS_MEAN: float(valid.mean()), names.RETURNS_MAX: float(valid.max()),
                        names.RETURNS_MIN: float(valid.min())})
    return out


def per_token_timings(metrics: dict[str, float], num_response_tokens: float, num_tokens: float) -> dict[str, float]:
    """``timing_per_token_ms/<node>`` for the timed nodes verl times per token (0 without tokens)."""
    out = {}
    for nodes, tokens in ((names.PER_TOKEN_RESPONSE_NODES, num_response_tokens), (names.PER_TOKEN_ALL_NODES, num_tokens)):
        for node in nodes:
            seconds = metrics.get(names.timing(node))
            if seconds is not None:
                out[names.timing_per_token(node)] = seconds * 1000.0 / tokens if tokens > 0 else 0.0
    return out

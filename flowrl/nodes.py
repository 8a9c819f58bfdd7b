"""Graph nodes: the bodies of the Dask tasks that graphs/ wire together.

A node is a coarse task: it takes worker-group calls (``BoundCall``, sequence number reserved
when the graph was built) and tables, dispatches one method to every rank, waits with a timeout
and returns a :class:`NodeOut`: the value plus metrics. :func:`node` wraps a body so that its wall
time lands in ``timing_s/<name>`` and metrics flow downstream to the last node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.actors.group import BoundCall
from flowrl.data import experience


@dataclass
class NodeOut:
    value: Any
    metrics: dict[str, float] = field(default_factory=dict)


def node(name: str, fn: Callable[..., Any], *args: Any, step: int = 0, **kwargs: Any) -> Any:
    """A delayed call of ``fn`` as the graph node ``name`` (key ``name-<step>``)."""
    from dask import delayed

    return delayed(_run_node, pure=False)(name, fn, *args, dask_key_name=f"{name}-{step:06d}", **kwargs)


def _run_node(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> NodeOut:
    metrics: dict[str, float] = {}

    def unwrap(x: Any) -> Any:
        if isinstance(x, NodeOut):
            metrics.update(x.metrics)
            return x.value
        return x

    args = tuple(unwrap(a) for a in args)
    kwargs = {k: unwrap(v) for k, v in kwargs.items()}
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    elapsed = time.perf_counter() - start
    if isinstance(out, NodeOut):
        metrics.update(out.metrics)
        out = out.value
    metrics[f"timing_s/{name}"] = elapsed
    return NodeOut(out, metrics)


# --------------------------------------------------------------------------- bodies
def generate(rollout: BoundCall, prompts: pa.Table, seed: int) -> NodeOut:
    table, compute_s = rollout.run("generate", prompts, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT, kwargs={"seed": seed})
    return NodeOut(table, {"compute_s/gen": compute_s})


@lru_cache(maxsize=4)
def _tokenizer(tokenizer_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def reward(table: pa.Table, tokenizer_dir: str, reward_fn: str) -> NodeOut:
    """Decode responses (without EOS) and score them; the outcome reward sits on the last token."""
    from flowrl.rewards import resolve_reward_fn, split_score

    fn = resolve_reward_fn(reward_fn)
    tok = _tokenizer(tokenizer_dir)
    responses = table.column("response_ids").to_pylist()
    texts = tok.batch_decode(responses, skip_special_tokens=True)
    sources = table.column("data_source").to_pylist()
    truths = table.column("ground_truth").to_pylist()
    infos = table.column("extra_info").to_pylist() if "extra_info" in table.column_names else [None] * len(texts)
    scores = np.zeros(len(texts), dtype=np.float32)
    extras: dict[str, list[float]] = {}
    for i, (src, text, truth, info) in enumerate(zip(sources, texts, truths, infos)):
        try:
            scores[i], extra = split_score(fn(src, text, truth, info))
        except Exception as exc:
            raise RuntimeError(f"reward function {reward_fn!r} failed on row {i} (data_source={src!r}): {exc}") from exc
        for k, v in extra.items():
            extras.setdefault(k, []).append(v)
    lengths = [len(r) for r in responses]
    token_rewards = [[0.0] * (n - 1) + [float(s)] if n else [] for n, s in zip(lengths, scores)]
    out = experience.with_columns(
        table,
        score=pa.array(scores, pa.float32()),
        token_rewards=experience.from_lists(token_rewards, experience.TOKEN_FLOATS),
    )
    return NodeOut(out, {f"reward/{k}": float(np.mean(v)) for k, v in extras.items()})


def logprobs(group: BoundCall, table: pa.Table, column: str) -> NodeOut:
    """A one-column table of ``column`` (log-probs of the sampled responses under the group's model)."""
    result, compute_s = group.run(
        "compute_logprobs", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.CONCAT, kwargs={"column": column}
    )
    return NodeOut(result, {f"compute_s/{column}": compute_s})


def advantages(table: pa.Table, *columns: pa.Table, estimator: str, gamma: float, lam: float, norm_adv_by_std: bool) -> pa.Table:
    """Join the log-prob columns, then compute advantages and returns (pure torch, in the task)."""
    import torch

    from flowrl.algos import ADVANTAGE_ESTIMATORS, AdvantageInputs

    for extra in columns:
        table = experience.with_columns(table, **{name: extra.column(name) for name in extra.column_names})
    rewards_T, cu = experience.token_column(table, "token_rewards")
    mask_T, _ = experience.token_column(table, "response_mask")
    group_B = torch.from_numpy(table.column("group").to_numpy().astype(np.int64))
    inputs = AdvantageInputs(token_rewards_T=rewards_T, response_mask_T=mask_T, cu_seqlens_B1=cu, group_B=group_B)
    adv_T, ret_T = ADVANTAGE_ESTIMATORS.get(estimator)(inputs, gamma=gamma, lam=lam, norm_adv_by_std=norm_adv_by_std)
    return experience.with_columns(
        table,
        advantages=experience.list_column(adv_T, cu, experience.TOKEN_FLOATS),
        returns=experience.list_column(ret_T, cu, experience.TOKEN_FLOATS),
    )


def update(actor: BoundCall, table: pa.Table, mini_batch_rows: int) -> NodeOut:
    metrics, compute_s = actor.run(
        "update", table, scatter_mode=Scatter.SPLIT, gather_mode=Gather.OUTPUT, kwargs={"mini_batch_rows": mini_batch_rows}
    )
    return NodeOut(metrics, {**metrics, "compute_s/update_actor": compute_s})


def sync_weights(actor: BoundCall, rollout: BoundCall, _after: Any) -> NodeOut:
    """Full-state path: the trainer's HF-named weights to every rollout rank."""
    state, gather_s = actor.run("hf_state_dict", gather_mode=Gather.FIRST)
    _, load_s = rollout.run("load_hf_state", state, scatter_mode=Scatter.BROADCAST)
    return NodeOut(None, {"compute_s/sync_weights": gather_s + load_s})


def collect(table: pa.Table, *_after: Any) -> NodeOut:
    """The step's result: the final experience table and its data metrics (verl's names)."""
    return NodeOut(table, data_metrics(table))


def data_metrics(table: pa.Table) -> dict[str, float]:
    score = table.column("score").to_numpy()
    resp = experience.lengths(table, "response_ids")
    prompt = experience.lengths(table, "prompt_ids")
    out = {
        "critic/score/mean": float(score.mean()),
        "critic/score/max": float(score.max()),
        "critic/score/min": float(score.min()),
        "response_length/mean": float(resp.mean()),
        "response_length/max": float(resp.max()),
        "response_length/min": float(resp.min()),
        "prompt_length/mean": float(prompt.mean()),
        "num_samples": float(table.num_rows),
        "num_response_tokens": float(resp.sum()),
        "num_tokens": float(resp.sum() + prompt.sum()),
    }
    if "advantages" in table.column_names:
        adv, _ = experience.token_column(table, "advantages")
        if adv.numel():
            out.update({"critic/advantages/mean": float(adv.mean()), "critic/advantages/max": float(adv.max()), "critic/advantages/min": float(adv.min())})
    if "rollout_logprobs" in table.column_names and "old_logprobs" in table.column_names:
        a, _ = experience.token_column(table, "rollout_logprobs")
        b, _ = experience.token_column(table, "old_logprobs")
        if a.numel():
            out["rollout/logprob_diff_max"] = float((a - b).abs().max())
    return out

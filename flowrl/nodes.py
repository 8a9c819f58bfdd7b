"""Graph nodes: the bodies of the Dask tasks that graphs/ wire together.

A node is a coarse task: it takes worker-group calls (``BoundCall``, sequence number reserved
when the graph was built) and tables, dispatches one method to every rank, waits with a timeout
and returns a :class:`NodeOut`: the value plus metrics. :func:`node` wraps a body so that its wall
time lands in ``timing_s/<name>``, its wall-clock start and end in ``NodeOut.spans``, and metrics
and spans flow downstream to the last node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa

from flowrl.actors.dispatch import Gather, Scatter
from flowrl.actors.group import BoundCall, WorkerGroup
from flowrl.data import experience

if TYPE_CHECKING:
    from flowrl.backends.reshard import ReshardJob


@dataclass
class NodeOut:
    value: Any
    metrics: dict[str, float] = field(default_factory=dict)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Node name -> (start, end) wall-clock seconds (``time.time()``) of this node and every node
    upstream of it; the trainer writes them to ``timeline.jsonl`` (the dashboard's Gantt)."""


def node(name: str, fn: Callable[..., Any], *args: Any, step: int = 0, **kwargs: Any) -> Any:
    """A delayed call of ``fn`` as the graph node ``name`` (key ``name-<step>``)."""
    from dask import delayed

    return delayed(_run_node, pure=False)(name, fn, *args, dask_key_name=f"{name}-{step:06d}", **kwargs)


def _run_node(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> NodeOut:
    metrics: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}

    def unwrap(x: Any) -> Any:
        if isinstance(x, NodeOut):
            metrics.update(x.metrics)
            spans.update(x.spans)
            return x.value
        return x

    args = tuple(unwrap(a) for a in args)
    kwargs = {k: unwrap(v) for k, v in kwargs.items()}
    wall_start = time.time()
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    elapsed = time.perf_counter() - start
    if isinstance(out, NodeOut):
        metrics.update(out.metrics)
        spans.update(out.spans)
        out = out.value
    metrics[f"timing_s/{name}"] = elapsed
    spans[name] = (wall_start, wall_start + elapsed)
    return NodeOut(out, metrics, spans)


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
    """Join the log-prob (and value) columns, then compute advantages and returns (pure torch, in
    the task). Reads ``values`` and ``reward_baseline`` when the table has them."""
    import torch

    from flowrl.algos import AdvantageInputs, resolve_estimator

    for extra in columns:
        table = experience.with_columns(table, **{name: extra.column(name) for name in extra.column_names})
    rewards_T, cu = experience.token_column(table, "token_rewards")
    mask_T, _ = experience.token_column(table, "response_mask")
    group_B = torch.from_numpy(table.column("group").to_numpy().astype(np.int64))
    # Optional inputs of some estimators: critic values (gae), a reward baseline per row (remax).
    values_T = experience.token_column(table, "values")[0] if "values" in table.column_names else None
    baseline_B = None
    if "reward_baseline" in table.column_names:
        baseline_B = torch.from_numpy(table.column("reward_baseline").to_numpy().astype(np.float32))
    inputs = AdvantageInputs(
        token_rewards_T=rewards_T, response_mask_T=mask_T, cu_seqlens_B1=cu, group_B=group_B,
        values_T=values_T, reward_baseline_B=baseline_B,
    )
    adv_T, ret_T = resolve_estimator(estimator)(inputs, gamma=gamma, lam=lam, norm_adv_by_std=norm_adv_by_std)
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


def reshard(actor: BoundCall, rollout: BoundCall, _after: Any, job: "ReshardJob") -> NodeOut:
    """Training shards -> generation ranks (``flowrl.backends.reshard``): every rank of both groups
    runs its part of ``job`` at once, over the groups' joint gloo group (joined on first use)."""
    import dataclasses

    from flowrl.actors.group import wait_all

    timeout = max(actor.group.timeout_s, rollout.group.timeout_s)
    if job.joint is not None and not job.joint.host:  # rendezvous at the actor's rank 0
        host, port = actor.group.actors[0].host_port().result(timeout=timeout)
        job = dataclasses.replace(job, joint=dataclasses.replace(job.joint, host=host, port=port))
    futures, addresses = [], []
    for bound in (actor, rollout):
        futures += [a.call(bound.seq, "reshard", (job,), {}, timeout) for a in bound.group.actors]
        addresses += bound.group.addresses
    results = wait_all(futures, timeout, f"{actor.group.name}+{rollout.group.name}.reshard", addresses)
    return NodeOut(None, reshard_metrics([r for r, _ in results], max(s for _, s in results)))


def reshard_local(group: BoundCall, _after: Any, job: "ReshardJob") -> NodeOut:
    """Colocated reshard (``job.placement`` colocated): each rank of one group (``HybridRole``)
    moves its trainer's shards into the group's generation engines."""
    stats, seconds = group.run("reshard", job, gather_mode=Gather.ALL)
    return NodeOut(None, reshard_metrics(stats, seconds))


def reshard_metrics(per_process: list[dict], seconds: float) -> dict[str, float]:
    """``reshard/bytes`` (received over the network, all processes), ``reshard/bytes_min`` (the
    plan's theoretical minimum), ``reshard/peak_extra_bytes`` (the largest staging peak of any
    process) and ``compute_s/reshard`` (the slowest process)."""
    return {
        "reshard/bytes": float(sum(s["bytes_received"] for s in per_process)),
        "reshard/bytes_min": float(per_process[0]["bytes_min"]),
        "reshard/peak_extra_bytes": float(max(s["peak_extra_bytes"] for s in per_process)),
        "compute_s/reshard": seconds,
    }


def build_reshard(cfg: Any, actor: WorkerGroup, rollout: WorkerGroup, after: Any, *, step: int) -> Any:
    """The ``reshard`` node of a run (actor group -> rollout group), ordered after ``after``.

    Binds the actor's and then the rollout's next call now, so the rollout's next ``gen`` runs
    after this reshard has written the new weights. The job (``job_for_run``) is derived in the
    node, where ``model.path`` is readable."""
    return node("reshard", _reshard_run, actor.bind(), rollout.bind(), after, cfg, step=step)


def _reshard_run(actor: BoundCall, rollout: BoundCall, after: Any, cfg: Any) -> NodeOut:
    from flowrl.backends.reshard import job_for_run

    return reshard(actor, rollout, after, job_for_run(cfg))


def release_rollout(rollout: BoundCall, table: pa.Table) -> NodeOut:
    """Colocated mode: every rollout rank releases its KV cache and parks its weights (vLLM sleep)
    until the next weight sync; passes ``table`` through so what follows runs after it."""
    _, seconds = rollout.run("sleep")
    return NodeOut(table, {"compute_s/rollout_sleep": seconds})


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

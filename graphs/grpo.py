"""GRPO: one iteration as a Dask graph.

    prompts  = sample a batch of prompts                               (client, this step's table)
    samples  = generate n responses per prompt            on rollout   (split by dp rank)
    scored   = score each response with the reward function            (a plain task)
    ref      = reference log-probs of the responses       on ref       } in parallel,
    old      = pre-update log-probs (several steps only)  on actor     } different workers
    batch    = group-normalised advantages                             (flowrl.algos)
    stats    = PPO-clip update with KL to the reference   on actor
    synced   = reshard: trainer shards -> rollout layout, only the slices each rank lacks
    return batch, metrics

Each line below is one node; the math lives in ``flowrl.algos``, the machinery in
``flowrl.actors`` and ``flowrl.nodes``. Nothing runs until the graph is computed.

The step's result (``collect``) does not wait for the weight sync (``reshard``, see
``flowrl.backends.reshard``): the rollout group runs its calls in reserved order, so the next
iteration's ``gen`` cannot start before this ``reshard`` has written the new weights, and the
driver may submit the next graph while the reshard runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask

import pyarrow as pa

from flowrl import nodes
from flowrl.actors import WorkerGroup
from flowrl.config import RunConfig
from flowrl.nodes import node


@dataclass
class GRPOGroups:
    """The worker groups one GRPO iteration calls."""

    rollout: WorkerGroup
    actor: WorkerGroup
    ref: WorkerGroup | None = None


@dataclass
class IterationGraph:
    """One iteration: ``result`` computes to ``NodeOut(table, metrics)``; ``sync`` to the
    reshard's ``NodeOut(None, metrics)``. Compute both (``Session.submit``)."""

    result: Any
    sync: Any

    @property
    def outputs(self) -> list[Any]:
        return [self.result, self.sync]

    def visualize(self, filename: str = "grpo", **kwargs: Any) -> Any:
        """Draw the graph (needs graphviz)."""
        return dask.visualize(*self.outputs, filename=filename, **kwargs)

    def dependencies(self) -> dict[str, set[str]]:
        """Task key -> the keys it depends on."""
        from dask.highlevelgraph import HighLevelGraph

        graph = HighLevelGraph.merge(*(o.__dask_graph__() for o in self.outputs))
        return {str(k): {str(d) for d in deps} for k, deps in graph.get_all_dependencies().items()}


def build_iteration(cfg: RunConfig, groups: GRPOGroups, prompts: pa.Table, *, step: int, tokenizer_dir: str) -> IterationGraph:
    """The graph of one GRPO iteration."""
    algo, actor = cfg.algorithm, cfg.actor
    samples = node("gen", nodes.generate, groups.rollout.bind(), prompts, seed=cfg.trainer.seed * 100003 + step, step=step)
    if cfg.rollout.free_cache_engine:  # colocated: the engine frees its memory until the reshard
        samples = node("rollout_sleep", nodes.release_rollout, groups.rollout.bind(), samples, step=step)
    scored = node("reward", nodes.reward, samples, tokenizer_dir, algo.reward_fn, step=step)

    columns = []
    if cfg.needs_reference:
        columns.append(node("ref", nodes.logprobs, groups.ref.bind(), scored, "ref_logprobs", step=step))
    if cfg.needs_old_logprobs:
        columns.append(node("old_log_prob", nodes.logprobs, groups.actor.bind(), scored, "old_logprobs", step=step))

    batch = node(
        "adv",
        nodes.advantages,
        scored,
        *columns,
        estimator=algo.adv_estimator,
        gamma=algo.gamma,
        lam=algo.lam,
        norm_adv_by_std=algo.norm_adv_by_std_in_grpo,
        step=step,
    )
    mini_batch_rows = actor.ppo_mini_batch_size * cfg.rollout.n // actor.data_parallel_size
    stats = node("update_actor", nodes.update, groups.actor.bind(), batch, mini_batch_rows, step=step)
    synced = nodes.build_reshard(cfg, groups.actor, groups.rollout, stats, step=step)
    return IterationGraph(result=node("collect", nodes.collect, batch, stats, step=step), sync=synced)

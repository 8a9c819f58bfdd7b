"""GRPO (and every critic-free estimator without a baseline): one iteration as a Dask graph.

    prompts  = sample a batch of prompts                               (client, this step's table)
    samples  = generate n responses per prompt            on rollout   (split by dp rank)
    scored   = score each response with the reward function            (a plain task)
    ref      = reference log-probs of the responses       on ref       } in parallel,
    old      = pre-update log-probs (several steps only)  on actor     } different workers
    batch    = group-normalised advantages                             (flowrl.algos)
    stats    = PPO-clip update with KL to the reference   on actor
    synced   = reshard: trainer shards -> rollout layout, only the slices each rank lacks
    return batch, metrics

    [scored  = + the reward model's score, + DAPO's overlong penalty   (reward_model.*)]
    [scored  = rewards - kl_coef * KL(old || ref)            (algorithm.use_kl_in_reward)]
    [samples = DAPO's dynamic sampling: the driver generates and scores rounds of prompts until
               enough groups have varying scores, before the graph  (algorithm.filter_groups)]

Each line is one node (the bracketed ones only when their setting asks for them, see
``flowrl.graphs.pieces``); the math lives in ``flowrl.algos``, the machinery in
``flowrl.actors`` and ``flowrl.nodes``. Nothing runs until the graph is computed.

The step's result (``collect``) does not wait for the weight sync (``reshard``, see
``flowrl.backends.reshard``): the rollout group runs its calls in reserved order, so the next
iteration's ``gen`` cannot start before this ``reshard`` has written the new weights, and the
driver may submit the next graph while the reshard runs.
"""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa

from flowrl import nodes
from flowrl.config import RunConfig
from flowrl.graphs import pieces
from flowrl.graphs.family import BuildContext, Family, IterationGraph, register_family
from flowrl.nodes import NodeOut, node


@register_family("grpo")
class GRPO(Family):
    """Group-relative advantages from the reward alone: no critic, no greedy baseline."""

    takes_images = True  # configs/vlm_shapes.yaml (dp, fsdp; hf and vllm generation)

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        if cfg.needs_critic or cfg.needs_reward_baseline:
            raise ValueError(f"the grpo family has no critic and no greedy baseline, which "
                             f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} needs; leave algorithm.family "
                             "empty (the estimator picks its family) or set it to ppo / remax")
        self.state = pieces.driver_state(cfg)  # the KL controller with use_kl_in_reward

    @classmethod
    def accepts(cls, cfg: RunConfig) -> bool:
        return not (cfg.needs_critic or cfg.needs_reward_baseline)

    def group_specs(self) -> list[Any]:
        return pieces.policy_specs(self.cfg) + pieces.reward_model_specs(self.cfg)

    def collect(self, ctx: BuildContext, prompts: pa.Table, *, step: int, compute: Callable[[Any], NodeOut],
                dataset: Any) -> NodeOut | None:
        return pieces.dynamic_sampling(ctx, prompts, step=step, compute=compute, dataset=dataset)

    def rollout(self, ctx: BuildContext, prompts: pa.Table, *, step: int, weight_version: int, round: int = 0) -> Any:
        # trainer.staleness > 0 or trainer.async_mode=stream (round: one request of the step's batch)
        return pieces.rollout(ctx, prompts, step=step, weight_version=weight_version, round=round)

    def build(self, ctx: BuildContext, prompts: pa.Table, *, step: int, collected: NodeOut | None = None) -> IterationGraph:
        if collected is None:
            samples = pieces.generate(ctx, prompts, step=step)
            samples = pieces.release_rollout(ctx, samples, step=step)  # colocated: free the engine's memory
            scored = pieces.score(ctx, samples, step=step)
        else:  # dynamic sampling's kept samples, generated and scored by collect()
            scored = pieces.release_rollout(ctx, collected, step=step)

        columns = pieces.logprob_columns(ctx, scored, step=step)  # ref, old_log_prob
        scored, columns = pieces.kl_in_reward(ctx, self.state, scored, columns, step=step)
        batch = pieces.advantages(ctx, scored, columns, step=step)
        stats = pieces.update_actor(ctx, batch, step=step)
        synced = pieces.weight_sync(ctx, stats, step=step)
        return IterationGraph(result=node("collect", nodes.collect, batch, stats, step=step), sync=synced)

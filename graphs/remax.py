"""ReMax (estimators that need a reward baseline): one iteration as a Dask graph.

    prompts  = sample a batch of prompts                                  (client)
    samples  = generate n responses per prompt               on rollout
    scored   = score each response with the reward function               (a plain task)
    ref      = reference log-probs                           on ref     } in parallel,
    old      = pre-update log-probs                          on actor   } different workers
    greedy   = one greedy response per prompt                on rollout   (after samples)
    scored   = + each prompt's greedy score as the samples' reward baseline
    batch    = advantages: reward - baseline                             (flowrl.algos)
    stats    = PPO-clip update                                          on actor
    synced   = reshard: trainer shards -> rollout layout
    return batch, metrics

Colocated (``rollout.free_cache_engine``), the engine is released after the greedy generation.
The reward model, overlong shaping and the KL reward penalty are the shared options of
``flowrl.graphs.pieces``; dynamic sampling is refused by the config (the greedy baseline covers
round 0's prompts only).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from flowrl import nodes
from flowrl.config import RunConfig
from flowrl.graphs import pieces
from flowrl.graphs.family import BuildContext, Family, IterationGraph, register_family
from flowrl.nodes import NodeOut, node


@register_family("remax")
class ReMax(Family):
    """The greedy response's score as each prompt's baseline: a second generation per step."""

    takes_images = True  # the greedy baseline reads the same prompts, images included (RolloutRole.generate)

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        if not cfg.needs_reward_baseline:
            raise ValueError(f"the remax family generates a greedy baseline for an estimator that reads one; "
                             f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} does not; use remax, or leave "
                             "algorithm.family empty (the estimator picks its family)")
        self.state = pieces.driver_state(cfg)  # the KL controller with use_kl_in_reward

    @classmethod
    def accepts(cls, cfg: RunConfig) -> bool:
        return cfg.needs_reward_baseline and not cfg.needs_critic  # with values too: ppo

    def group_specs(self) -> list[Any]:
        return pieces.policy_specs(self.cfg) + pieces.reward_model_specs(self.cfg)

    def rollout(self, ctx: BuildContext, prompts: pa.Table, *, step: int, weight_version: int, round: int = 0) -> Any:
        # trainer.staleness > 0 or trainer.async_mode=stream (round: one request of the step's batch)
        return pieces.rollout(ctx, prompts, step=step, weight_version=weight_version, round=round)

    def build(self, ctx: BuildContext, prompts: pa.Table, *, step: int, collected: NodeOut | None = None) -> IterationGraph:
        scored = collected if collected is not None else pieces.score(ctx, pieces.generate(ctx, prompts, step=step), step=step)
        columns = pieces.logprob_columns(ctx, scored, step=step)  # ref, old_log_prob

        scored = pieces.greedy_baseline(ctx, scored, prompts, step=step)  # gen_baseline, reward_baseline
        scored = pieces.release_rollout(ctx, scored, step=step)  # colocated: after both generations
        scored, columns = pieces.kl_in_reward(ctx, self.state, scored, columns, step=step)
        batch = pieces.advantages(ctx, scored, columns, step=step)
        stats = pieces.update_actor(ctx, batch, step=step)
        synced = pieces.weight_sync(ctx, stats, step=step)
        return IterationGraph(result=node("collect", nodes.collect, batch, stats, step=step), sync=synced)

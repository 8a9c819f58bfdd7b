"""PPO with a critic (estimators that need values, e.g. ``gae``): one iteration as a Dask graph.

    prompts  = sample a batch of prompts                                  (client)
    samples  = generate n responses per prompt               on rollout
    scored   = score each response with the reward function               (a plain task)
    values   = the critic's value of every response token    on critic  }
    ref      = reference log-probs                           on ref     } in parallel,
    old      = pre-update log-probs                          on actor   } different workers
    [greedy  = ReMax's greedy baseline, for an estimator that reads values and a baseline]
    [release = colocated: the rollout engine frees its memory after the step's generations]
    batch    = GAE advantages and returns from the values               (flowrl.algos)
    critic   = clipped value-loss update, ppo_epochs x mini-batches      on critic  } in parallel
    stats    = PPO-clip update                                          on actor   }
    synced   = reshard: trainer shards -> rollout layout
    return batch, metrics (+ the critic's: values, returns, explained variance)

With ``trainer.critic_warmup`` = N the first N steps stop after ``critic`` (no ``stats``, no
``synced``: the actor and the rollout keep their weights). The reward model, overlong shaping, the KL reward penalty and dynamic sampling are the shared
options of ``flowrl.graphs.pieces``, as in GRPO. The critic is trained and checkpointed with the
actor (``critic_checkpoints/``).
"""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa

from flowrl import nodes
from flowrl.config import RunConfig
from flowrl.graphs import pieces
from flowrl.graphs.family import BuildContext, Family, IterationGraph, register_family
from flowrl.nodes import NodeOut, node


@register_family("ppo")
class PPO(Family):
    """Advantages from a learned value function: adds the critic group, its values and update."""

    takes_images = True  # the critic too (flowrl.models.vlm_value)

    checkpointed_groups = ("critic",)

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        if not cfg.needs_critic:
            raise ValueError(f"the ppo family trains a critic for an estimator that reads values; "
                             f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} does not; use gae, or leave "
                             "algorithm.family empty (the estimator picks its family)")
        self.state = pieces.driver_state(cfg)  # the KL controller with use_kl_in_reward

    @classmethod
    def accepts(cls, cfg: RunConfig) -> bool:
        return cfg.needs_critic

    def group_specs(self) -> list[Any]:
        from flowrl.roles.specs import critic_spec

        return pieces.policy_specs(self.cfg) + [critic_spec(self.cfg)] + pieces.reward_model_specs(self.cfg)

    def collect(self, ctx: BuildContext, prompts: pa.Table, *, step: int, compute: Callable[[Any], NodeOut],
                dataset: Any) -> NodeOut | None:
        return pieces.dynamic_sampling(ctx, prompts, step=step, compute=compute, dataset=dataset)

    def rollout(self, ctx: BuildContext, prompts: pa.Table, *, step: int, weight_version: int, round: int = 0) -> Any:
        # trainer.staleness > 0 or trainer.async_mode=stream (round: one request of the step's batch)
        return pieces.rollout(ctx, prompts, step=step, weight_version=weight_version, round=round)

    def build(self, ctx: BuildContext, prompts: pa.Table, *, step: int, collected: NodeOut | None = None) -> IterationGraph:
        cfg, critic = ctx.cfg, ctx.groups["critic"]
        # dynamic sampling's kept samples (generated and scored by collect()), or one batch's
        scored = collected if collected is not None else pieces.score(ctx, pieces.generate(ctx, prompts, step=step), step=step)
        values = node("values", nodes.values, critic.bind(), scored, step=step)
        columns = [values] + pieces.logprob_columns(ctx, scored, step=step)  # values, ref, old_log_prob
        if cfg.needs_reward_baseline:  # an estimator reading values and a greedy baseline
            scored = pieces.greedy_baseline(ctx, scored, prompts, step=step)
        scored = pieces.release_rollout(ctx, scored, step=step)  # colocated: after the step's generations
        scored, columns = pieces.kl_in_reward(ctx, self.state, scored, columns, step=step)
        batch = pieces.advantages(ctx, scored, columns, step=step)
        critic_rows = pieces.mini_batch_rows(cfg, cfg.critic)
        critic_stats = node("update_critic", nodes.update_critic, critic.bind(), batch, critic_rows, step=step)
        if step < cfg.trainer.critic_warmup:  # the critic alone: no actor update, no weight sync
            warmup = node("critic_warmup", nodes.critic_warmup, critic_stats, step=step)
            return IterationGraph(result=node("collect", nodes.collect_with_values, batch, warmup, step=step), sync=warmup)
        stats = pieces.update_actor(ctx, batch, step=step)
        synced = pieces.weight_sync(ctx, stats, step=step)
        result = node("collect", nodes.collect_with_values, batch, stats, critic_stats, step=step)
        return IterationGraph(result=result, sync=synced)

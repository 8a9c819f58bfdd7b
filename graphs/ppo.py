"""PPO with a critic (and the rest of the family): one iteration as a Dask graph.

    prompts  = sample a batch of prompts                                  (client)
    samples  = generate n responses per prompt               on rollout
    scored   = score each response with the reward function               (a plain task)
    values   = the critic's value of every response token    on critic  }
    ref      = reference log-probs                           on ref     } in parallel,
    old      = pre-update log-probs                          on actor   } different workers
    [scored  = + DAPO's overlong penalty   when reward_model.overlong_buffer.enable]
    [scored  = DAPO's dynamic sampling: keep groups whose scores vary; generate and score more
               prompts (in the driver, one small graph per round) until the batch is full]
    [greedy  = one greedy response per prompt, scored: ReMax's baseline  on rollout]
    [scored  = rewards - kl_coef * KL(old || ref)   when algorithm.use_kl_in_reward]
    batch    = GAE advantages and returns from the values               (flowrl.algos)
    critic   = clipped value-loss update, ppo_epochs x mini-batches      on critic  } in parallel
    stats    = PPO-clip update                                          on actor   }
    synced   = reshard: trainer shards -> rollout layout (nodes.build_reshard)
    return batch, metrics

The bracketed nodes appear only when their setting asks for them; the trainer uses this graph
whenever the estimator needs a critic or a baseline, the KL is a reward penalty, or a DAPO piece
is on (else the leaner ``graphs/grpo.py``). The KL coefficient is the driver's: :class:`AlgorithmState` keeps the
controller across steps and feeds each step's measured KL back into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flowrl import algo_nodes, nodes
from flowrl.actors import WorkerGroup
from flowrl.config import RunConfig
from flowrl.graphs.grpo import GRPOGroups, IterationGraph
from flowrl.nodes import node


@dataclass
class PPOGroups(GRPOGroups):
    """The worker groups one PPO iteration calls: GRPO's plus the critic."""

    critic: WorkerGroup | None = None
    rm: WorkerGroup | None = None


def uses_ppo_graph(cfg: RunConfig) -> bool:
    """Whether ``cfg`` needs this graph (a critic, a greedy baseline or a KL reward penalty)."""
    return (
        cfg.needs_critic or cfg.needs_reward_baseline or cfg.algorithm.use_kl_in_reward
        or cfg.algorithm.filter_groups.enable or cfg.reward_model.overlong_buffer.enable or cfg.reward_model.enable
    )


class AlgorithmState:
    """What the driver keeps across iterations: the KL reward penalty's controller."""

    def __init__(self, cfg: RunConfig) -> None:
        from flowrl.algos import make_kl_controller

        k = cfg.algorithm.kl_ctrl
        self.kl_ctrl = (
            make_kl_controller(k.type, kl_coef=k.kl_coef, target_kl=k.target_kl, horizon=k.horizon)
            if cfg.algorithm.use_kl_in_reward
            else None
        )

    @property
    def kl_coef(self) -> float:
        return self.kl_ctrl.value if self.kl_ctrl is not None else 0.0

    def observe(self, metrics: dict[str, float]) -> None:
        """After a step: update the controller with the KL it measured over ``num_samples`` rows."""
        if self.kl_ctrl is not None and "actor/reward_kl_penalty" in metrics:
            self.kl_ctrl.update(metrics["actor/reward_kl_penalty"], int(metrics["num_samples"]))

    def state(self) -> dict:
        return {"kl_ctrl": self.kl_ctrl.state() if self.kl_ctrl is not None else None}

    def load_state(self, state: dict) -> None:
        if self.kl_ctrl is not None and state.get("kl_ctrl"):
            self.kl_ctrl.value = float(state["kl_ctrl"]["value"])


def build_iteration(
    cfg: RunConfig,
    groups: PPOGroups,
    prompts: pa.Table,
    *,
    step: int,
    tokenizer_dir: str,
    kl_coef: float = 0.0,
    session: Any = None,
    dataset: Any = None,
) -> IterationGraph:
    """The graph of one PPO-family iteration; ``kl_coef`` is the KL reward penalty's coefficient.

    With dynamic sampling on, building runs the generation rounds (``session`` computes them,
    ``dataset`` gives the extra prompts) and the graph starts from the kept samples."""
    from flowrl.backends.generate.hf import SamplingParams

    algo, actor, critic, n = cfg.algorithm, cfg.actor, cfg.critic, cfg.rollout.n
    if algo.filter_groups.enable:
        scored = dynamic_sampling(cfg, groups, prompts, step=step, tokenizer_dir=tokenizer_dir, session=session, dataset=dataset)
    else:
        scored = sample_and_score(cfg, groups, prompts, step=step, tokenizer_dir=tokenizer_dir)

    columns = []
    if cfg.needs_critic:
        columns.append(node("values", algo_nodes.values, groups.critic.bind(), scored, step=step))
    if cfg.needs_reference:
        columns.append(node("ref", nodes.logprobs, groups.ref.bind(), scored, "ref_logprobs", step=step))
    if cfg.needs_old_logprobs:
        columns.append(node("old_log_prob", nodes.logprobs, groups.actor.bind(), scored, "old_logprobs", step=step))
    if cfg.needs_reward_baseline:
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=cfg.rollout.response_length)
        greedy_samples = node("gen_baseline", algo_nodes.generate_greedy, groups.rollout.bind(), prompts, greedy, step=step)
        scored = node("reward_baseline", algo_nodes.reward_baseline, scored, greedy_samples, tokenizer_dir, algo.reward_fn, step=step)
    if cfg.rollout.free_cache_engine:  # colocated: the engine frees its memory until the reshard
        scored = node("rollout_sleep", nodes.release_rollout, groups.rollout.bind(), scored, step=step)
    if algo.use_kl_in_reward:
        scored = node("kl_in_reward", algo_nodes.kl_in_reward, scored, *columns, coef=kl_coef, estimator=algo.kl_penalty, step=step)
        columns = []  # joined

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
    updates = []
    if cfg.needs_critic:
        critic_rows = critic.ppo_mini_batch_size * n // critic.data_parallel_size
        updates.append(node("update_critic", algo_nodes.update_critic, groups.critic.bind(), batch, critic_rows, step=step))
    actor_rows = actor.ppo_mini_batch_size * n // actor.data_parallel_size
    stats = node("update_actor", nodes.update, groups.actor.bind(), batch, actor_rows, step=step)
    synced = nodes.build_reshard(cfg, groups.actor, groups.rollout, stats, step=step)
    result = node("collect", algo_nodes.collect_ppo, batch, stats, *updates, step=step)
    return IterationGraph(result=result, sync=synced)


def sample_and_score(cfg: RunConfig, groups: PPOGroups, prompts: pa.Table, *, step: int, tokenizer_dir: str, round: int = 0) -> Any:
    """gen -> reward [+ reward model] [-> overlong]; round ``k`` > 0 (dynamic sampling) has its
    own seed and keys."""
    sfx = f"_r{round}" if round else ""
    seed = cfg.trainer.seed * 100003 + step + round * 1_000_003
    samples = node("gen" + sfx, nodes.generate, groups.rollout.bind(), prompts, seed=seed, step=step)
    scored = node("reward" + sfx, nodes.reward, samples, tokenizer_dir, cfg.algorithm.reward_fn, step=step)
    rm = cfg.reward_model
    if rm.enable:  # the reward model scores on its own group, in parallel with the reward function
        rm_scores = node("rm_score" + sfx, algo_nodes.rm_scores, groups.rm.bind(), samples, step=step)
        scored = node("combine_rewards" + sfx, algo_nodes.combine_rewards, scored, rm_scores,
                      rule_coef=rm.rule_coef, rm_coef=rm.rm_coef, step=step)
    ob = cfg.reward_model.overlong_buffer
    if ob.enable:
        scored = node("overlong" + sfx, algo_nodes.overlong, scored, max_response_length=cfg.rollout.response_length,
                      buffer_len=ob.len, penalty_factor=ob.penalty_factor, step=step)
    return scored


def dynamic_sampling(cfg: RunConfig, groups: PPOGroups, prompts: pa.Table, *, step: int, tokenizer_dir: str,
                     session: Any, dataset: Any) -> Any:
    """DAPO's dynamic sampling, as a loop of small graphs run by the driver: sample and score a
    batch, keep the groups whose ``filter_groups.metric`` varies, and repeat with further prompts
    until ``data.train_batch_size`` groups are kept (the surplus is dropped, as verl). Returns the
    kept samples (a constant ``NodeOut`` carrying every round's metrics) for the rest of the graph."""
    import pyarrow.compute as pc

    from flowrl.data import experience
    from flowrl.nodes import NodeOut

    if session is None or dataset is None:
        raise ValueError("dynamic sampling builds its rounds with the run's session and dataset; pass both")
    fg, want = cfg.algorithm.filter_groups, cfg.data.train_batch_size
    kept: list[pa.Table] = []
    metrics: dict[str, float] = {}
    num_kept, rounds, seen = 0, 0, 0
    while num_kept < want:
        if fg.max_num_gen_batches and rounds >= fg.max_num_gen_batches:
            raise RuntimeError(
                f"dynamic sampling kept {num_kept} of {want} prompt groups after {rounds} generation rounds "
                f"(algorithm.filter_groups.max_num_gen_batches={fg.max_num_gen_batches}): almost every group scores "
                "the same. Raise max_num_gen_batches (0: no limit), check the reward function, or disable filter_groups"
            )
        batch = prompts
        if rounds:  # further prompts: another deterministic draw, group ids kept apart from round 0's
            batch = dataset.batch(step, want, seed=cfg.trainer.seed + rounds * 1_000_003, shuffle=True)
            batch = experience.with_columns(batch, group=pc.add(batch.column("group"), pa.scalar(rounds << 40, pa.int64())))
        scored = sample_and_score(cfg, groups, batch, step=step, tokenizer_dir=tokenizer_dir, round=rounds)
        out = session.compute(node(f"filter_groups{'_r%d' % rounds if rounds else ''}", algo_nodes.filter_groups,
                                   scored, fg.metric, step=step), timeout=cfg.cluster.timeout_s)
        seen += int(out.metrics["dynamic_sampling/groups"])
        metrics.update({k: v for k, v in out.metrics.items() if not k.startswith("dynamic_sampling/")})
        kept.append(out.value)
        num_kept += int(out.metrics["dynamic_sampling/kept_groups"])
        rounds += 1
    table = pa.concat_tables(kept)
    group_order = list(dict.fromkeys(table.column("group").to_pylist()))[:want]  # first `want` kept groups
    table = table.filter(pc.is_in(table.column("group"), pa.array(group_order, pa.int64())))
    metrics.update({
        "train/num_gen_batches": float(rounds),
        "dynamic_sampling/kept_group_frac": num_kept / max(seen, 1),
        "dynamic_sampling/num_samples": float(table.num_rows),
    })
    return NodeOut(table, metrics)


def group_specs(cfg: RunConfig) -> list[Any]:
    """The worker groups this graph adds to GRPO's: the critic when the estimator needs one, the
    reward model when enabled."""
    from flowrl.actors import GroupMesh
    from flowrl.actors.session import GroupSpec

    specs = []
    if cfg.needs_critic:
        c = cfg.critic
        specs.append(GroupSpec(
            "critic", "flowrl.roles.critic:CriticRole",
            {"model_dir": c.model_path or cfg.model.path, "critic": c, "dtype": cfg.model.dtype,
             "response_length": cfg.rollout.response_length, "seed": cfg.trainer.seed},
            GroupMesh(dp=c.data_parallel_size, tp=c.tensor_model_parallel_size, pp=c.pipeline_model_parallel_size),
        ))
    if cfg.reward_model.enable:
        rm = cfg.reward_model
        specs.append(GroupSpec(
            "rm", "flowrl.roles.reward_model:RewardModelRole",
            {"model_dir": rm.model_path, "dtype": cfg.model.dtype, "micro_batch_size": rm.micro_batch_size_per_gpu},
            GroupMesh(dp=rm.data_parallel_size, tp=1, pp=1),
        ))
    return specs

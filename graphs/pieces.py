"""Building pieces every family can use: the orthogonal options of the config, each in one place.

- sampling and scoring: ``gen`` (seeded from (seed, step, round)), the reward function, with
  ``reward_model.enable`` the reward model on its own group and the combination, with
  ``reward_model.overlong_buffer.enable`` DAPO's overlong shaping;
- ``rollout.free_cache_engine``: the colocated engine's release after generation;
- the log-prob columns (reference, pre-update actor) the config needs;
- ``algorithm.use_kl_in_reward``: the KL reward penalty and its controller (:class:`KLInReward`,
  a family's driver state, checkpointed as ``{"kl_ctrl": ...}``);
- ``algorithm.filter_groups.enable``: DAPO's dynamic sampling as a driver hook
  (:func:`dynamic_sampling`, a family's ``collect``): rounds of small graphs computed by the
  driver until the batch has enough informative groups;
- the advantages, the actor update and the weight sync.

Each function adds nodes to a graph and returns them; none computes, except
:func:`dynamic_sampling`, which is a driver hook.
"""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa

from flowrl import nodes
from flowrl.config import RunConfig
from flowrl.graphs.base import BuildContext, FamilyState
from flowrl.metrics import names
from flowrl.nodes import NodeOut, node

ROUND_SEED_STRIDE = 1_000_003
"""Dynamic sampling's round ``k`` seeds its generation and its prompt draw ``k`` strides apart."""


# --------------------------------------------------------------------------- worker groups
def policy_specs(cfg: RunConfig) -> list[Any]:
    """The groups every family starts: rollout, actor, and the reference when the config needs
    reference log-probs."""
    from flowrl.roles.specs import actor_spec, needs_ref_group, ref_spec, rollout_spec

    # LoRA (issue 17): no reference group, the actor's base model is the reference (roles.specs)
    return [rollout_spec(cfg), actor_spec(cfg)] + ([ref_spec(cfg)] if needs_ref_group(cfg) else [])


def reward_model_specs(cfg: RunConfig) -> list[Any]:
    """The reward model's group when ``reward_model.enable``."""
    from flowrl.roles.specs import rm_spec

    return [rm_spec(cfg)] if cfg.reward_model.enable else []


# --------------------------------------------------------------------------- sampling and scoring
def gen_seed(cfg: RunConfig, step: int, round: int = 0) -> int:
    """The generation seed of ``step`` (round ``round`` of dynamic sampling): a pure function
    of ``trainer.seed``, so a resumed run repeats the uninterrupted one."""
    return cfg.trainer.seed * 100003 + step + round * ROUND_SEED_STRIDE


def generate(ctx: BuildContext, prompts: pa.Table, *, step: int, round: int = 0, weight_version: int | None = None) -> Any:
    """``gen``: ``rollout.n`` responses per prompt on the rollout group (with ``weight_version``:
    each row tagged with the weight version that generates it, see :func:`rollout`)."""
    sfx = f"_r{round}" if round else ""
    extra = {} if weight_version is None else {"weight_version": weight_version}
    return node("gen" + sfx, nodes.generate, ctx.groups["rollout"].bind(), prompts,
                seed=gen_seed(ctx.cfg, step, round), step=step, **extra)


def rollout(ctx: BuildContext, prompts: pa.Table, *, step: int, weight_version: int, round: int = 0) -> Any:
    """``gen`` then the scoring of :func:`score`: the generation part of an iteration on its own,
    which the run computes ahead with ``trainer.staleness`` > 0 (a family's ``rollout``); its
    rows carry ``weight_version``. Reserves only rollout (and reward model) calls. ``round``:
    one of several requests of ``step``'s batch (stream mode), with its own seed and node keys."""
    samples = generate(ctx, prompts, step=step, round=round, weight_version=weight_version)
    return score(ctx, samples, step=step, round=round)


def stream_batch(requests: list[Any], *, step: int) -> Any:
    """``stream_batch``: the outputs of the stream requests that make up ``step``'s batch (each a
    family's ``rollout``, already submitted) as one scored table, what ``build(collected=...)``
    takes. Their ``timing_s``/``compute_s`` are summed under the plain node names (``gen``,
    ``reward``); their spans stay apart (``gen_r1`` ...), for the timeline and the idle times."""
    return node("stream_batch", _concat_requests, list(requests), step=step)


def _concat_requests(outs: list[NodeOut]) -> NodeOut:
    import re

    from flowrl.data import experience

    metrics: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}
    for out in outs:
        spans.update(out.spans)
        for key, value in out.metrics.items():
            plain = re.sub(r"(_p\d+)?(_r\d+)?$", "", key)  # gen_p1_r2 (a piece of request 2) -> gen
            if plain.startswith(("timing_s/", "compute_s/")):
                metrics[plain] = metrics.get(plain, 0.0) + value
            else:  # a request's mean (agent/*, reward/*): the mean over the equal-sized requests
                metrics[plain] = metrics.get(plain, 0.0) + value / len(outs)
    return NodeOut(experience.concat([o.value for o in outs]), metrics, spans)


def release_rollout(ctx: BuildContext, table: Any, *, step: int) -> Any:
    """Colocated (``rollout.free_cache_engine``): the engine frees its memory until the reshard;
    ``table`` passes through. Otherwise ``table`` itself."""
    from flowrl.config.free_cache_auto import free_cache_engine

    if not free_cache_engine(ctx.cfg):  # auto resolved (flowrl.config.free_cache_auto)
        return table
    return node("rollout_sleep", nodes.release_rollout, ctx.groups["rollout"].bind(), table, step=step)


def score(ctx: BuildContext, samples: Any, *, step: int, round: int = 0) -> Any:
    """reward function [+ reward model, in parallel, combined] [-> overlong shaping]."""
    cfg, sfx = ctx.cfg, f"_r{round}" if round else ""
    scored = node("reward" + sfx, nodes.reward, samples, ctx.tokenizer_dir, cfg.algorithm.reward_fn,
                  cfg.reward_model.reward_timeout_s, step=step)
    rm = cfg.reward_model
    if rm.enable:  # the reward model scores on its own group, in parallel with the reward function
        rm_scores = node("rm_score" + sfx, nodes.rm_scores, ctx.groups["rm"].bind(), samples, step=step)
        scored = node("combine_rewards" + sfx, nodes.combine_rewards, scored, rm_scores,
                      rule_coef=rm.rule_coef, rm_coef=rm.rm_coef, step=step)
    ob = rm.overlong_buffer
    if ob.enable:
        scored = node("overlong" + sfx, nodes.overlong, scored, max_response_length=cfg.rollout.response_length,
                      buffer_len=ob.len, penalty_factor=ob.penalty_factor, step=step)
    return scored


def logprob_columns(ctx: BuildContext, scored: Any, *, step: int) -> list[Any]:
    """``ref`` (reference log-probs, when needed) and ``old_log_prob`` (pre-update log-probs,
    with several optimizer steps per batch), in parallel on their groups."""
    cfg, columns = ctx.cfg, []
    if cfg.needs_reference:  # LoRA (issue 17): on the actor, adapters disabled (roles.specs.reference_call)
        from flowrl.roles.specs import reference_call

        group, method = reference_call(cfg)
        columns.append(node("ref", nodes.logprobs, ctx.groups[group].bind(), scored, "ref_logprobs", method=method,
                            step=step))
    if cfg.algorithm.rollout_is_bypass:  # bypass mode: pi_old := pi_rollout, no pass (flowrl.nodes.bypass)
        from flowrl.nodes.bypass import rollout_as_old_logprobs

        columns.append(node("old_log_prob", rollout_as_old_logprobs, scored, step=step))
    elif cfg.needs_old_logprobs:  # optimal_token_baseline: sum_pi_squared from the same pass
        method = ("compute_logprobs_with_sum_pi_squared" if cfg.algorithm.adv_estimator == "optimal_token_baseline"
                  else "compute_logprobs")
        columns.append(node("old_log_prob", nodes.logprobs, ctx.groups["actor"].bind(), scored, "old_logprobs",
                            method=method, step=step))
    return columns


def greedy_sampling(cfg: RunConfig) -> Any:
    """One greedy response per prompt, as long as the sampled ones may be."""
    from flowrl.backends.interfaces import SamplingParams

    from dataclasses import replace

    return replace(SamplingParams.from_section(cfg.rollout, max_new_tokens=cfg.rollout.response_length, greedy=True), n=1)


def greedy_baseline(ctx: BuildContext, scored: Any, prompts: pa.Table, *, step: int) -> Any:
    """ReMax's baseline: ``gen_baseline`` (one greedy response per prompt, on the rollout group
    after the sampled ones), then ``reward_baseline`` (its score on each of the prompt's samples)."""
    cfg = ctx.cfg
    greedy = node("gen_baseline", nodes.generate_greedy, ctx.groups["rollout"].bind(), prompts, greedy_sampling(cfg),
                  step=step)
    return node("reward_baseline", nodes.reward_baseline, scored, greedy, ctx.tokenizer_dir, cfg.algorithm.reward_fn,
                cfg.reward_model.reward_timeout_s, step=step)


# --------------------------------------------------------------------------- KL in the reward
class KLInReward(FamilyState):
    """The KL reward penalty's controller (``algorithm.kl_ctrl``), kept across steps: each step's
    measured KL feeds it; its coefficient goes into the next graph."""

    def __init__(self, cfg: RunConfig) -> None:
        self._kl_ctrl_cfg = cfg.algorithm.kl_ctrl
        self.reset()

    def reset(self) -> None:
        from flowrl.algos import make_kl_controller

        k = self._kl_ctrl_cfg
        self.kl_ctrl = make_kl_controller(k.type, kl_coef=k.kl_coef, target_kl=k.target_kl, horizon=k.horizon)

    @property
    def kl_coef(self) -> float:
        return self.kl_ctrl.value

    def observe(self, metrics: dict[str, float]) -> None:
        """After a step: update the controller with the KL it measured over ``num_samples`` rows."""
        if names.REWARD_KL_PENALTY in metrics:
            self.kl_ctrl.update(metrics[names.REWARD_KL_PENALTY], int(metrics[names.NUM_SAMPLES]))

    def state_dict(self) -> dict:
        return {"kl_ctrl": self.kl_ctrl.state()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kl_ctrl"):
            self.kl_ctrl.value = float(state["kl_ctrl"]["value"])


def driver_state(cfg: RunConfig) -> FamilyState:
    """A family's driver state: the KL controller with ``algorithm.use_kl_in_reward``, else none."""
    return KLInReward(cfg) if cfg.algorithm.use_kl_in_reward else FamilyState()


def kl_in_reward(ctx: BuildContext, state: FamilyState, scored: Any, columns: list[Any], *, step: int) -> tuple[Any, list[Any]]:
    """With ``algorithm.use_kl_in_reward``: ``rewards - kl_coef * KL(old || ref)``, joining the
    log-prob ``columns`` (then none are left to join). Otherwise (scored, columns) unchanged."""
    if not ctx.cfg.algorithm.use_kl_in_reward:
        return scored, columns
    if not isinstance(state, KLInReward):
        raise ValueError(f"algorithm.use_kl_in_reward=true needs the family's state to hold the KL controller, got "
                         f"{type(state).__name__}; set the family's state to pieces.driver_state(cfg)")
    scored = node("kl_in_reward", nodes.kl_in_reward, scored, *columns, coef=state.kl_coef,
                  estimator=ctx.cfg.algorithm.kl_penalty, step=step)
    return scored, []


# --------------------------------------------------------------------------- advantages, update, sync
def advantages(ctx: BuildContext, scored: Any, columns: list[Any], *, step: int) -> Any:
    """``adv``: the configured estimator's advantages and returns (``flowrl.algos``)."""
    algo = ctx.cfg.algorithm
    return node("adv", nodes.advantages, scored, *columns, estimator=algo.adv_estimator, gamma=algo.gamma,
                lam=algo.lam, norm_adv_by_std=algo.norm_adv_by_std_in_grpo, step=step)


def rollout_correction(ctx: BuildContext, batch: Any, *, step: int) -> Any:
    """``rollout_corr``: importance weights between the pre-update and the rollout log-probs
    (``algorithm.rollout_is*``, ``flowrl.algos.rollout_correction``), applied to the batch the
    actor trains on when ``algorithm.rollout_is``; ``batch`` itself when the correction is off."""
    algo = ctx.cfg.algorithm
    if algo.rollout_is_threshold is None or algo.rollout_is_bypass:  # bypass: in the actor's loss
        return batch
    return node("rollout_corr", nodes.rollout_correction, batch, threshold=algo.rollout_is_threshold,
                threshold_lower=algo.rollout_is_threshold_lower, level=algo.rollout_is_level, mode=algo.rollout_is_mode,
                veto_threshold=algo.rollout_is_veto_threshold, apply=algo.rollout_is, step=step)


def mini_batch_rows(cfg: RunConfig, group_cfg: Any) -> int:
    """Rows per dp rank in one mini-batch of ``group_cfg`` (the actor's or the critic's section)."""
    return group_cfg.ppo_mini_batch_size * cfg.rollout.n // group_cfg.data_parallel_size


def update_actor(ctx: BuildContext, batch: Any, *, step: int) -> Any:
    """``update_actor``: the PPO-clip update on the actor group (on the rollout-corrected batch
    when ``algorithm.rollout_is_threshold`` is set, see :func:`rollout_correction`)."""
    batch = rollout_correction(ctx, batch, step=step)
    return node("update_actor", nodes.update, ctx.groups["actor"].bind(), batch, mini_batch_rows(ctx.cfg, ctx.cfg.actor),
                step=step)


def weight_sync(ctx: BuildContext, stats: Any, *, step: int) -> Any:
    """``reshard``: the actor's new weights to the rollout group, after ``stats``."""
    return nodes.build_reshard(ctx.cfg, ctx.groups["actor"], ctx.groups["rollout"], stats, step=step)


# --------------------------------------------------------------------------- dynamic sampling (DAPO)
def dynamic_sampling(ctx: BuildContext, prompts: pa.Table, *, step: int, compute: Callable[[Any], NodeOut],
                     dataset: Any) -> NodeOut | None:
    """DAPO's dynamic sampling, a driver hook (None unless ``algorithm.filter_groups.enable``):
    sample and score a batch, keep the groups whose ``filter_groups.metric`` varies, and repeat
    with further prompts until ``data.train_batch_size`` groups are kept (the surplus is dropped,
    as verl). Each round is a small graph ``compute`` runs. Returns the kept samples with every
    round's metrics, for the family's ``build(..., collected=...)``."""
    cfg = ctx.cfg
    fg, want = cfg.algorithm.filter_groups, cfg.data.train_batch_size
    if not fg.enable:
        return None
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
        batch = prompts if not rounds else _round_prompts(cfg, dataset, step, rounds)
        scored = score(ctx, generate(ctx, batch, step=step, round=rounds), step=step, round=rounds)
        out = compute(node(f"filter_groups{'_r%d' % rounds if rounds else ''}", nodes.filter_groups, scored, fg.metric,
                           step=step))
        seen += int(out.metrics[names.GROUPS])
        metrics.update({k: v for k, v in out.metrics.items() if not k.startswith(names.DYNAMIC_SAMPLING_PREFIX)})
        kept.append(out.value)
        num_kept += int(out.metrics[names.KEPT_GROUPS])
        rounds += 1
    return _first_groups(kept, want, metrics, rounds=rounds, kept_frac=num_kept / max(seen, 1))


def _round_prompts(cfg: RunConfig, dataset: Any, step: int, round: int) -> pa.Table:
    """Round ``round``'s prompts: another deterministic draw, group ids kept apart from round 0's."""
    import pyarrow.compute as pc

    from flowrl.data import experience

    batch = dataset.batch(step, cfg.data.train_batch_size, seed=cfg.trainer.seed + round * ROUND_SEED_STRIDE, shuffle=True)
    return experience.with_columns(batch, group=pc.add(batch.column("group"), pa.scalar(round << 40, pa.int64())))


def _first_groups(kept: list[pa.Table], want: int, metrics: dict[str, float], *, rounds: int, kept_frac: float) -> NodeOut:
    """The rows of the first ``want`` kept groups, with the rounds' metrics."""
    import pyarrow.compute as pc

    table = pa.concat_tables(kept)
    group_order = list(dict.fromkeys(table.column("group").to_pylist()))[:want]
    table = table.filter(pc.is_in(table.column("group"), pa.array(group_order, pa.int64())))
    metrics.update({
        names.NUM_GEN_BATCHES: float(rounds),
        names.KEPT_GROUP_FRAC: kept_frac,
        names.DYNAMIC_NUM_SAMPLES: float(table.num_rows),
    })
    return NodeOut(table, metrics)

"""The run configuration: typed dataclasses, one per section, validated on construction.

Names follow verl where verl has one (``data.train_batch_size``, ``rollout.n``,
``actor.ppo_mini_batch_size``, ``actor.kl_loss_type``, ``algorithm.adv_estimator``, ...), flattened:
verl's ``actor_rollout_ref.actor.optim.lr`` is ``actor.optim.lr`` here. Every field has a docstring
(the string literal under it), which ``flowrl config --fields`` prints.

Validation raises :class:`~flowrl.config.errors.ConfigError` naming the field, the value and the
fix; the loader prefixes the section path. Cross-section rules live in :class:`RunConfig`; the
sections in ``sections.py`` (data, model, optim, trainer), ``roles.py`` (rollout, actor, ref,
critic, reward_model), ``algorithm.py`` and ``cluster.py``. Names of algorithms and backends are
checked against the registries (``flowrl.catalog.algos``, ``flowrl.catalog.backends``), which
import no torch; backend rules read the chosen backend's capabilities, never its name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowrl.catalog.algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES, estimator_traits
from flowrl.catalog.backends import GEN_BACKENDS, TRAIN_BACKENDS, checkpoint_problem
from flowrl.config.algorithm import AlgorithmConfig
from flowrl.config.cluster import ClusterConfig
from flowrl.config.errors import ConfigError, check
from flowrl.config.pools import check_placement, resolve_placement
from flowrl.config.rollout_engine import check_max_model_len
from flowrl.config.roles import (ActorConfig, CriticConfig, ReferenceConfig, RewardModelConfig, RolloutConfig,
                                 check_reference_budget)
from flowrl.config.sections import DataConfig, ModelConfig, TrainerConfig
from flowrl.config.sandbox import SandboxConfig


def name_mistakes(adv_estimator: Any, kl_penalty: Any) -> list[ConfigError]:
    """The registry names of ``algorithm`` that are not registered: checked on their own, so that a
    command line with other mistakes reports these in the same pass (issue 35 item 6)."""
    out = []
    try:
        estimator_traits(adv_estimator)
    except (ValueError, TypeError) as exc:
        out.append(ConfigError(
            "algorithm.adv_estimator", adv_estimator, f"is not an advantage estimator ({exc})",
            "use one of " + ", ".join(ADVANTAGE_ESTIMATORS.names())
            + ", or package.module:function of a function decorated with @register_estimator"))
    problem = KL_ESTIMATORS.problem(kl_penalty)
    if problem is not None:
        out.append(ConfigError("algorithm.kl_penalty", kl_penalty, problem, KL_ESTIMATORS.fix()))
    return out


@dataclass(kw_only=True)
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    """Prompt data."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy's starting checkpoint."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The trained policy."""
    ref: ReferenceConfig = field(default_factory=ReferenceConfig)
    """The frozen reference policy."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (PPO with ``algorithm.adv_estimator=gae``)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Reward shaping (DAPO's overlong buffer)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and rewards."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The loop."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Where the workers run."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Where model-written code runs (the python tool, code rewards; issue 38)."""

    def __post_init__(self) -> None:
        self._check_algorithm_family()
        if "max_model_len" in GEN_BACKENDS.spec(self.rollout.name).config_keys:  # vLLM's context against both sections
            check_max_model_len(self.rollout, max_prompt_length=self.data.max_prompt_length)
        check(self.trainer.test_freq >= 0, "trainer.test_freq", self.trainer.test_freq, "must be >= 0",
              "use 0 (never validate) or e.g. 5 (every 5 steps)")
        check(self.data.val_max_samples == -1 or self.data.val_max_samples >= 1, "data.val_max_samples",
              self.data.val_max_samples, "must be -1 (all) or >= 1", "use -1")
        for key, value, registry in (("actor.policy_loss", self.actor.policy_loss, POLICY_LOSSES),
                                     ("actor.kl_loss_type", self.actor.kl_loss_type, KL_ESTIMATORS)):
            problem = registry.problem(value)  # a name, or package.module:function (imported here)
            check(problem is None, key, value, problem, registry.fix())
        check(not (self.actor.policy_loss == "geo_mean" and self.algorithm.rollout_is and self.algorithm.rollout_is_level
                   == "token"), "algorithm.rollout_is_level", "token", "with actor.policy_loss=geo_mean it weights each "
              "row by the arithmetic mean of its token weights (flowrl applies them as w * A), verl by their "
              "geometric mean", "use algorithm.rollout_is_level=sequence (one weight per row: verl's numbers)")
        if self.algorithm.adv_estimator == "optimal_token_baseline":
            from flowrl.config.otb_checks import check_otb

            check_otb(self)
        check(not self.algorithm.rollout_is_bypass or self.actor.policy_loss == "vanilla", "actor.policy_loss",
              self.actor.policy_loss, "is replaced in bypass mode (algorithm.rollout_is_bypass=true) by "
              "algorithm.rollout_is_loss_type (ppo_clip or reinforce), as in verl", "use actor.policy_loss=vanilla")
        mini, batch = self.actor.ppo_mini_batch_size, self.data.train_batch_size
        check(
            mini <= batch and batch % mini == 0,
            "actor.ppo_mini_batch_size",
            mini,
            f"must divide data.train_batch_size={batch}",
            f"use actor.ppo_mini_batch_size={batch} (one optimizer step per batch) or a divisor of it",
        )
        samples_per_mini = mini * self.rollout.n
        dp = self.actor.data_parallel_size
        check(
            samples_per_mini % dp == 0,
            "actor.ppo_mini_batch_size",
            mini,
            f"times rollout.n={self.rollout.n} gives {samples_per_mini} samples, not divisible by "
            f"actor.data_parallel_size={dp}",
            "choose sizes so that ppo_mini_batch_size * rollout.n is a multiple of the data-parallel size",
        )
        for role, o in (("actor", self.actor.optim), ("critic", self.critic.optim)):
            # the setting that needs the run's length, named as it is (a warm-up under a constant schedule too)
            offenders = [(k, v, off) for k, v, off, on in (
                ("lr_scheduler_type", o.lr_scheduler_type, "constant", o.lr_scheduler_type != "constant"),
                ("lr_warmup_steps", o.lr_warmup_steps, 0, o.lr_warmup_steps > 0),
                ("lr_warmup_steps_ratio", o.lr_warmup_steps_ratio, 0, o.lr_warmup_steps_ratio != 0)) if on]
            key, value, off = offenders[0] if offenders else (None, None, None)
            check(self.trainer.total_training_steps > 0 or key is None, f"{role}.optim.{key}", value,
                  "a schedule or warm-up needs the run's length, and trainer.total_training_steps is 0: deriving "
                  "it from the data's size (verl's way) is not built in flowrl",
                  f"set trainer.total_training_steps (with total_epochs: the cap), or {role}.optim.{key}={off}")
        problem = checkpoint_problem(TRAIN_BACKENDS.spec(self.actor.strategy), self.actor)
        if problem is not None and self.trainer.save_freq > 0:
            raise ConfigError("trainer.save_freq", self.trainer.save_freq, *problem)
        check_reference_budget(self.ref, self.actor)  # token-budget micro-batches (issue 14)
        check_placement(self)  # the pools cover the groups; cluster.placement=hybrid's rules (issue 14)
        self._check_async()

    def _check_async(self) -> None:
        """``trainer.staleness`` and ``trainer.critic_warmup`` against the rest (issue 15, 19)."""
        t = self.trainer
        key, value = ("trainer.async_mode", t.async_mode) if t.async_mode == "stream" else ("trainer.staleness", t.staleness)
        if t.staleness > 0 or t.async_mode == "stream":
            check(self.cluster.controller != "driver", "cluster.controller", self.cluster.controller,
                  f"runs graphs in the driver, which cannot feed one graph's pending output into another ({key}={value} "
                  "generates ahead)", "set cluster.controller=worker (or auto), or trainer.staleness=0")
            check(self.rollout.free_cache_engine is not True, key, value,
                  "overlaps generation with the update, but rollout.free_cache_engine=true shares the trainer's devices "
                  "(the engine sleeps while the trainer runs)",
                  "set rollout.free_cache_engine=false and cluster.placement=split (rollout on devices of its own), "
                  "or trainer.staleness=0")
            check(not self.algorithm.filter_groups.enable, key, value,
                  "is not implemented with dynamic sampling (algorithm.filter_groups.enable=true)",
                  "set trainer.staleness=0, or algorithm.filter_groups.enable=false")
        if t.async_mode == "stream":
            self._check_stream()
        check(not t.partial_rollout or t.async_mode == "stream", "trainer.partial_rollout", t.partial_rollout,
              "interrupts the requests of the stream mode only", "set trainer.async_mode=stream, or partial_rollout=false")
        check(not (t.partial_rollout and self.rollout.multi_turn.enable), "trainer.partial_rollout", t.partial_rollout,
              "is not implemented for multi-turn rollouts (rollout.multi_turn.enable=true)",
              "set trainer.partial_rollout=false")
        check(t.critic_warmup == 0 or self.needs_critic, "trainer.critic_warmup", t.critic_warmup,
              f"trains only a critic, and algorithm.adv_estimator={self.algorithm.adv_estimator!r} starts none",
              "use algorithm.adv_estimator=gae, or trainer.critic_warmup=0")

    def _check_stream(self) -> None:
        """``trainer.async_mode=stream``: requests that tile a batch, a queue that holds one."""
        t, batch = self.trainer, self.data.train_batch_size
        check(batch % self.stream_request_size == 0, "trainer.stream_request_size", t.stream_request_size,
              f"must divide data.train_batch_size={batch} (each step takes whole requests)",
              "use 0 (a quarter of the batch) or a divisor of data.train_batch_size")
        check(self.stream_request_size % self.rollout.data_parallel_size == 0, "trainer.stream_request_size",
              self.stream_request_size, f"must be a multiple of the {self.rollout.data_parallel_size} rollout ranks "
              "(each request is split over them)", f"use a multiple of {self.rollout.data_parallel_size}")
        check(t.max_queue_size == 0 or (t.max_queue_size >= batch and t.max_queue_size % self.stream_request_size == 0),
              "trainer.max_queue_size", t.max_queue_size,
              f"must hold one batch ({batch} groups) in whole requests of {self.stream_request_size}",
              f"use 0 ((staleness + 1) * {batch}) or a multiple of {self.stream_request_size} >= {batch}")

    @property
    def stream_request_size(self) -> int:
        """Prompts per stream request (``trainer.stream_request_size``, 0: a quarter of the batch)."""
        size, batch = self.trainer.stream_request_size, self.data.train_batch_size
        return size or (batch // 4 if batch % 4 == 0 and batch // 4 % self.rollout.data_parallel_size == 0 else batch)

    @property
    def stream_queue_size(self) -> int:
        """The stream's bound in prompt groups (``trainer.max_queue_size``, 0: ``(staleness + 1) * batch``)."""
        return self.trainer.max_queue_size or (self.trainer.staleness + 1) * self.data.train_batch_size

    @property
    def placement(self) -> str:
        """The placement this run starts: ``cluster.placement``, with ``auto`` resolved to
        ``hybrid`` where the config allows it, else ``colocated`` (``placement_reason`` says why)."""
        return resolve_placement(self)[0]

    @property
    def graph_controller(self) -> str:
        """Where the iteration graphs run (``cluster.controller`` with ``auto`` resolved): ``driver``
        for a local cluster without generation ahead, else ``worker``."""
        c, t = self.cluster, self.trainer
        if c.controller != "auto":
            return c.controller
        ahead = t.staleness > 0 or t.async_mode == "stream"
        return "driver" if c.kind == "local" and not ahead else "worker"

    @property
    def placement_reason(self) -> str:
        """Why :attr:`placement` (``""`` when ``cluster.placement`` named it): ``"auto"``, or
        ``"auto: rollout.name=vllm runs its own engine"`` for an auto that could not be hybrid."""
        return resolve_placement(self)[1]

    @property
    def worker_group_sizes(self) -> dict[str, int]:
        """The worker groups this run starts and their world sizes (what pools must host)."""
        sizes = {"rollout": self.rollout.world_size, "actor": self.actor.world_size}
        if self.needs_reference and not self.model.lora_rank:  # LoRA: the actor's base model is the reference
            sizes["ref"] = self.ref.world_size
        if self.needs_critic:
            sizes["critic"] = self.critic.world_size
        if self.reward_model.enable:
            sizes["rm"] = self.reward_model.world_size
        return sizes

    def _check_algorithm_family(self) -> None:
        """Critic, KL-in-reward and estimator rules (the PPO family's cross-section checks)."""
        algo = self.algorithm
        for mistake in name_mistakes(algo.adv_estimator, algo.kl_penalty):
            raise mistake
        ob = self.reward_model.overlong_buffer
        if ob.enable:
            check(ob.len <= self.rollout.response_length, "reward_model.overlong_buffer.len", ob.len,
                  f"exceeds rollout.response_length={self.rollout.response_length}",
                  f"use at most {self.rollout.response_length} (e.g. a quarter of it)")
        if algo.filter_groups.enable:
            check(self.rollout.n > 1, "algorithm.filter_groups.enable", True,
                  f"needs groups of several samples; rollout.n={self.rollout.n}", "set rollout.n >= 2")
            check(not self.needs_reward_baseline, "algorithm.filter_groups.enable", True,
                  f"with algorithm.adv_estimator={algo.adv_estimator}: the greedy baseline covers round 0's prompts only",
                  "disable filter_groups for remax, or use grpo / rloo")
        if not self.needs_critic:
            return
        mini, batch, n = self.critic.ppo_mini_batch_size, self.data.train_batch_size, self.rollout.n
        check(
            mini <= batch and batch % mini == 0,
            "critic.ppo_mini_batch_size",
            mini,
            f"must divide data.train_batch_size={batch}",
            f"use critic.ppo_mini_batch_size={batch} (one critic step per batch) or a divisor of it",
        )
        dp = self.critic.data_parallel_size
        check(
            mini * n % dp == 0,
            "critic.ppo_mini_batch_size",
            mini,
            f"times rollout.n={n} gives {mini * n} samples, not divisible by critic.data_parallel_size={dp}",
            "choose sizes so that critic.ppo_mini_batch_size * rollout.n is a multiple of critic.data_parallel_size",
        )

    @property
    def needs_critic(self) -> bool:
        """The advantage estimator reads values (``gae``): start the critic group."""
        return estimator_traits(self.algorithm.adv_estimator)["needs_values"]  # checked in __post_init__

    @property
    def needs_reward_baseline(self) -> bool:
        """The advantage estimator subtracts a greedy response's score (``remax``)."""
        return estimator_traits(self.algorithm.adv_estimator)["needs_baseline"]

    @property
    def num_optimizer_steps_per_batch(self) -> int:
        return self.actor.ppo_epochs * (self.data.train_batch_size // self.actor.ppo_mini_batch_size)

    @property
    def needs_old_logprobs(self) -> bool:
        """A separate old-log-prob pass is needed only when one batch feeds several optimizer
        steps; with one step the pre-update policy is the current one and the update uses its own
        detached log-probs (ratio exactly 1), which saves a forward pass. The KL reward penalty
        reads them too (as verl)."""
        return (self.num_optimizer_steps_per_batch > 1 or self.algorithm.use_kl_in_reward
                or self.algorithm.rollout_is_threshold is not None  # the rollout correction's pi_old
                or self.algorithm.rollout_is_bypass  # bypass mode: the rollout's, no pass (graphs/pieces.py)
                or self.algorithm.adv_estimator == "optimal_token_baseline")  # its W reads pi_old

    @property
    def needs_reference(self) -> bool:
        return self.actor.use_kl_loss or self.algorithm.use_kl_in_reward

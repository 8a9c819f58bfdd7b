"""The ``algorithm`` section: advantages, rewards, the KL reward penalty, dynamic sampling, and
which algorithm family runs.

Names are checked against ``flowrl.catalog.algos`` (torch-free); the estimator's cross-section
rules (a critic for ``gae``) live in :class:`~flowrl.config.schema.RunConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flowrl.catalog.algos import FILTER_METRICS, KL_CONTROLLERS
from flowrl.config.errors import check, check_one_of, check_positive


@dataclass(kw_only=True)
class KLCtrlConfig:
    """The coefficient of the KL reward penalty (``algorithm.use_kl_in_reward``), verl's names."""

    type: str = "fixed"
    """``fixed``: constant ``kl_coef``; ``adaptive``: steer the measured KL towards ``target_kl``."""
    kl_coef: float = 0.001
    """The (starting) coefficient."""
    target_kl: float = 0.1
    """Target KL per token of the adaptive controller."""
    horizon: int = 10000
    """Samples over which the adaptive controller moves the coefficient by up to 20%."""

    def __post_init__(self) -> None:
        check_one_of("type", self.type, KL_CONTROLLERS.names())
        check(self.kl_coef >= 0, "kl_coef", self.kl_coef, "must be >= 0", "use 0.001")
        check_positive("target_kl", self.target_kl, "use 0.1")
        check_positive("horizon", self.horizon, "use 10000")


@dataclass(kw_only=True)
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl's ``algorithm.filter_groups``)."""

    enable: bool = False
    """Drop prompt groups whose ``metric`` is the same for every sample (no learning signal) and
    generate more prompts until ``data.train_batch_size`` groups are kept."""
    metric: str = "score"
    """What must vary within a group: ``score`` (the task score), ``seq_reward`` (the row's summed
    token rewards, with shaping such as the overlong penalty) or ``seq_final_reward``."""
    max_num_gen_batches: int = 10
    """Give up (an error) after this many generation rounds in one step (0: no limit)."""

    def __post_init__(self) -> None:
        check_one_of("metric", self.metric, FILTER_METRICS)
        check(self.max_num_gen_batches >= 0, "max_num_gen_batches", self.max_num_gen_batches, "must be >= 0",
              "use 10 (or 0 for no limit)")


@dataclass(kw_only=True)
class SFTConfig:
    """Supervised fine-tuning data (``algorithm.family=sft``; the tokens' length also bounds the
    ``dpo`` and ``rm`` families' pairs). verl's SFT names (``data.messages_key``, ``data.max_length``)."""

    messages_key: str = "messages"
    """The column of chat messages (verl's ``data.messages_key``); a file without it is read as a
    ``data.prompt_key`` column with a ``response_key`` column."""
    response_key: str = "response"
    """The response column of prompt/response files (verl's legacy SFT ``data.response_key``)."""
    max_length: int = 1024
    """Tokens per row (prompt and response; verl's ``data.max_length``); longer rows follow
    ``data.truncation`` (``error``: refused, ``right``: the end cut, ``left``: the start cut)."""
    label_smoothing: float = 0.0
    """Label smoothing of the SFT loss (torch's ``cross_entropy(label_smoothing=...)``): the target
    puts ``1 - eps`` on the token and ``eps / V`` on each vocabulary entry; 0: plain NLL (verl's SFT
    has no such key). The default task's warm-up uses 0.4 (a policy right greedily, unsure when
    sampled). Train backends whose heads cannot compute it (megatron) refuse it by name."""
    label_smoothing_factor: float | None = None
    """TRL's ``SFTConfig`` name of ``label_smoothing``, accepted as an alias (None: not given)."""

    def __post_init__(self) -> None:
        if self.label_smoothing_factor is not None:  # TRL's name
            check(self.label_smoothing in (0.0, self.label_smoothing_factor), "label_smoothing_factor",
                  self.label_smoothing_factor, f"disagrees with algorithm.sft.label_smoothing={self.label_smoothing} "
                  "(the same setting under TRL's name)", "set only one of them")
            self.label_smoothing = self.label_smoothing_factor
        check(0.0 <= self.label_smoothing < 1.0, "label_smoothing", self.label_smoothing, "must be in [0, 1)",
              "use 0.0 (no smoothing) or e.g. 0.1")
        check(bool(self.messages_key), "messages_key", self.messages_key, "must name a column", "use messages")
        check(bool(self.response_key), "response_key", self.response_key, "must name a column", "use response")
        check_positive("max_length", self.max_length, "use e.g. 1024")


DPO_LOSS_TYPES = ("sigmoid", "ipo")


@dataclass(kw_only=True)
class DPOConfig:
    """Direct preference optimisation (``algorithm.family=dpo``), TRL's ``DPOConfig`` names."""

    beta: float = 0.1
    """The KL strength: rewards are ``beta * (log pi - log ref)`` of a completion."""
    loss_type: str = "sigmoid"
    """``sigmoid`` (DPO) or ``ipo`` (IPO: squared loss on length-averaged log-probs)."""
    label_smoothing: float = 0.0
    """The sigmoid loss's assumed label noise (cDPO); 0: none."""

    def __post_init__(self) -> None:
        check_positive("beta", self.beta, "use 0.1")
        check_one_of("loss_type", self.loss_type, DPO_LOSS_TYPES)
        check(0.0 <= self.label_smoothing < 0.5, "label_smoothing", self.label_smoothing, "must be in [0, 0.5)", "use 0.0")
        check(self.loss_type == "sigmoid" or self.label_smoothing == 0.0, "label_smoothing", self.label_smoothing,
              f"applies to the sigmoid loss only, not loss_type={self.loss_type!r}", "use 0.0")


@dataclass(kw_only=True)
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """Registered advantage estimator: grpo, rloo, reinforce_plus_plus,
    reinforce_plus_plus_baseline, remax (greedy baseline generation), gpg, gae (PPO: starts the critic);
    or ``package.module:function`` of a function decorated with ``@register_estimator``."""
    family: str = ""
    """The algorithm family that builds each step's graph and starts its worker groups. Empty: the
    family the estimator implies (the built-in whose ``accepts`` holds, e.g. PPO for ``gae``);
    else a registered family name (``flowrl.graphs.family.FAMILIES``) or ``package.module:Class``
    of a family class. Resolved when the run starts."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's std (False: Dr.GRPO)."""
    gamma: float = 1.0
    """Discount factor (token-level estimators)."""
    lam: float = 1.0
    """GAE lambda."""
    reward_fn: str = "auto"
    """Registered reward function, or ``module:function`` with verl's signature
    ``(data_source, solution_str, ground_truth, extra_info) -> float | dict``. ``auto`` picks by
    each row's data_source."""
    use_kl_in_reward: bool = False
    """Subtract ``kl_ctrl`` coefficient x KL(policy || reference) from the token rewards
    (InstructGPT-style PPO); needs the reference group."""
    kl_penalty: str = "k1"
    """KL estimator of the reward penalty: k1 (verl's ``kl``), abs, k2 (mse), k3 (low_var_kl); or
    ``package.module:function`` ``fn(logp_T, ref_logp_T) -> kl_T``."""
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    """Fixed or adaptive coefficient of the KL reward penalty."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling: keep only groups with a learning signal, sample more."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The supervised families' data: SFT columns, the token length of a row or pair."""
    dpo: DPOConfig = field(default_factory=DPOConfig)
    """DPO's loss (``algorithm.family=dpo``)."""
    rollout_is_threshold: float | None = None
    """Rollout correction (verl's key): the upper threshold of the importance weights
    ``pi_old / pi_rollout`` between the trainer's pre-update log-probs and the rollout's own.
    None: off (nothing computed, no ``rollout_corr/*`` metrics). See ``flowrl.algos.rollout_correction``."""
    rollout_is: bool = False
    """Apply the weights in the policy loss (verl's key); False: the ``rollout_corr/*`` metrics only."""
    rollout_is_threshold_lower: float | None = None
    """Lower threshold of the ``mask`` mode; None: ``1 / rollout_is_threshold`` (verl's)."""
    rollout_is_level: str = "token"
    """``token`` (each token's ratio), ``sequence`` (the product over the response) or
    ``geometric`` (the geometric mean over the response)."""
    rollout_is_mode: str = "truncate"
    """``truncate`` (TIS: weights capped at the threshold) or ``mask`` (MIS: tokens, or whole
    responses at the sequence levels, outside [lower, upper] leave the loss's response mask)."""
    rollout_is_veto_threshold: float | None = None
    """A response with any token ratio below this leaves the loss (verl's veto); None: off."""
    rollout_is_bypass: bool = False
    """verl's bypass mode (``rollout_correction.bypass_mode``): no pre-update log-prob pass,
    ``pi_old := pi_rollout``; the policy loss is ``rollout_is_loss_type`` with the weights and the
    rejection sampling computed in each micro-batch against the current policy
    (``flowrl.algos.rollout_correction.bypass_policy_loss``)."""
    rollout_is_loss_type: str = "ppo_clip"
    """Bypass mode's loss: ``ppo_clip`` (PPO clip with ratio pi / pi_rollout; the weights as
    metrics only) or ``reinforce`` (``-A * log pi * w``)."""
    rollout_is_batch_normalize: bool = False
    """Bypass mode: the importance weights divided by their mean (verl's key)."""
    rollout_rs: str | None = None
    """Bypass mode's rejection sampling (verl's key): a comma list of token_k1..3,
    seq_sum_k1..3, seq_mean_k1..3, seq_max_k2..3; tokens or rows outside the bounds leave the loss."""
    rollout_rs_threshold: str | None = None
    """The bounds of ``rollout_rs``: one spec for all options or one each, comma separated (k1:
    ``lower_upper`` ratio bounds or one upper; the others: one upper bound)."""

    def __post_init__(self) -> None:
        if self.kl_penalty == "kl":  # verl's name for k1
            self.kl_penalty = "k1"
        self._check_rollout_is()
        check(0 <= self.gamma <= 1, "gamma", self.gamma, "must be in [0, 1]", "use 1.0")
        check(0 <= self.lam <= 1, "lam", self.lam, "must be in [0, 1]", "use 1.0")

    def _check_rollout_is(self) -> None:
        """The rollout correction's fields (verl's names and values)."""
        check_one_of("rollout_is_level", self.rollout_is_level, ("token", "sequence", "geometric"))
        check_one_of("rollout_is_mode", self.rollout_is_mode, ("truncate", "mask"))
        t = self.rollout_is_threshold
        check(t is None or t > 0, "rollout_is_threshold", t, "must be > 0 (or null: off)", "use e.g. 2.0")
        check(not (self.rollout_is and t is None), "rollout_is", self.rollout_is,
              "applies the importance weights, which need algorithm.rollout_is_threshold", "set e.g. rollout_is_threshold=2.0")
        low = self.rollout_is_threshold_lower
        check(low is None or (t is not None and 0 < low <= t), "rollout_is_threshold_lower", low,
              "must be in (0, rollout_is_threshold]", "use null (1 / rollout_is_threshold)")
        from flowrl.config.rollout_bypass import check_bypass

        check_bypass(self)

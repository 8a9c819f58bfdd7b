"""Metric names, defined once (verl's names where verl has one).

Every name a library module writes or reads is a constant here, or built by one of the functions
below for families of names (``timing_s/<node>``); modules import these instead of spelling the
strings. The dashboard groups names by their prefix (``actor/``, ``critic/``, ``timing_s/`` ...).
Floor 0 (plain strings, no imports), so every floor may import it; ``flowrl.metrics.names``
re-exports it (``from flowrl.metrics import names``).
"""

from __future__ import annotations

# --------------------------------------------------------------------------- the step
STEP_TIME = "timing_s/step"
THROUGHPUT = "perf/throughput"
TIME_PER_STEP = "perf/time_per_step"
# Per-phase accounting (issue 14): real tokens per second of each phase, positions the model
# computed per real token (1.0: no padding), peak memory of a worker (the actor's rank 0).
GEN_TOKENS_PER_S = "perf/gen_tokens_per_s"
TRAIN_TOKENS_PER_S = "perf/train_tokens_per_s"
GEN_PADDING_RATIO = "perf/gen_padding_ratio"
TRAIN_PADDING_RATIO = "perf/train_padding_ratio"
MAX_MEMORY_ALLOCATED_GB = "perf/max_memory_allocated_gb"
MFU_ACTOR = "perf/mfu/actor"  # the actor update's model FLOPs utilisation against the GPU's peak bf16 rate (verl's)
MAX_RSS_GB = "perf/max_rss_gb"
ROLLOUT_MAX_RSS_GB = "perf/rollout_max_rss_gb"
ROLLOUT_MAX_MEMORY_ALLOCATED_GB = "perf/rollout_max_memory_allocated_gb"
# the trainer's state to the host and back between its phases (fsdp_config.param_offload /
# optimizer_offload): seconds since the previous update's report, this rank (0 on the CPU: nothing moves)
ACTOR_OFFLOAD_S = "perf/actor_offload_s"
ACTOR_ONLOAD_S = "perf/actor_onload_s"
CRITIC_OFFLOAD_S = "perf/critic_offload_s"  # the same for critic.fsdp_config.param_offload / optimizer_offload
CRITIC_ONLOAD_S = "perf/critic_onload_s"
CRITIC_TRAIN_TOKENS_PER_S = "perf/critic_train_tokens_per_s"
CRITIC_TRAIN_PADDING_RATIO = "perf/critic_train_padding_ratio"
TRAIN_SLOTS = "train_slots"  # an update stat: model positions computed, summed over ranks
TRAIN_TOKENS = "train_tokens"  # an update stat: real tokens (prompt + response), summed over ranks
GLOBAL_STEP = "training/global_step"  # verl's: the step's number, 1 for the first
EPOCH = "training/epoch"  # verl's: the 0-based pass over the prompts the step's batch belongs to
TOTAL_NUM_TOKENS = "perf/total_num_tokens"  # verl's: prompt + response tokens of the step's batch
VALIDATION_TIME = "timing_s/validation"

# --------------------------------------------------------------------------- data (verl's names)
SCORE_MEAN = "critic/score/mean"
SCORE_MAX = "critic/score/max"
SCORE_MIN = "critic/score/min"
ADVANTAGES_MEAN = "critic/advantages/mean"
ADVANTAGES_MAX = "critic/advantages/max"
ADVANTAGES_MIN = "critic/advantages/min"
RESPONSE_LENGTH_MEAN = "response_length/mean"
RESPONSE_LENGTH_MAX = "response_length/max"
RESPONSE_LENGTH_MIN = "response_length/min"
RESPONSE_LENGTH_CLIP_RATIO = "response_length/clip_ratio"  # responses that reached rollout.response_length
PROMPT_LENGTH_MEAN = "prompt_length/mean"
PROMPT_LENGTH_MAX = "prompt_length/max"
PROMPT_LENGTH_MIN = "prompt_length/min"
PROMPT_LENGTH_CLIP_RATIO = "prompt_length/clip_ratio"  # prompts of data.max_prompt_length tokens
REWARDS_MEAN = "critic/rewards/mean"  # verl's: per-sample sum of token rewards (the score less any KL penalty)
REWARDS_MAX = "critic/rewards/max"
REWARDS_MIN = "critic/rewards/min"
NUM_SAMPLES = "num_samples"
NUM_RESPONSE_TOKENS = "num_response_tokens"
NUM_TOKENS = "num_tokens"
ROLLOUT_LOGPROB_DIFF_MAX = "rollout/logprob_diff_max"
"""Largest |log-prob of the generation engine - log-prob of the trainer| over the batch's tokens."""
ROLLOUT_LOGPROB_DIFF_P99 = "rollout/logprob_diff_p99"
"""The 99th percentile of that gap over the batch's tokens: the max alone is the one token where
fp32 rounding is amplified most (sharp attention), the percentile the gap's bulk."""
ROLLOUT_LOGPROB_DIFF_MEAN = "rollout/logprob_diff_mean"
"""Its mean over the batch's tokens (verl: ``training/rollout_probs_diff_mean``, on probabilities)."""

# --------------------------------------------------------------------------- the critic (PPO)
VALUES_MEAN = "critic/values/mean"
VALUES_MAX = "critic/values/max"
VALUES_MIN = "critic/values/min"
RETURNS_MEAN = "critic/returns/mean"
RETURNS_MAX = "critic/returns/max"
RETURNS_MIN = "critic/returns/min"
VF_EXPLAINED_VAR = "critic/vf_explained_var"

# --------------------------------------------------------------------------- updates
ACTOR = "actor"
"""The prefix of the actor update's stats (``actor/<stat>``, ``run_epochs(prefix=ACTOR)``)."""
CRITIC = "critic"
"""The prefix of the critic update's stats (``critic/<stat>``)."""
PG_LOSS = "pg_loss"
KL_LOSS = "kl_loss"
ENTROPY = "entropy"
GRAD_NORM = "grad_norm"
VF_LOSS = "vf_loss"
NUM_OPTIMIZER_STEPS = "num_optimizer_steps"
UPDATE_S = "update_s"
PG_CLIPFRAC = "pg_clipfrac"
PG_CLIPFRAC_LOWER = "pg_clipfrac_lower"
PPO_KL = "ppo_kl"
VF_CLIPFRAC = "vf_clipfrac"
VPRED_MEAN = "vpred_mean"
LR = "lr"
ACTOR_PG_LOSS = "actor/pg_loss"
ACTOR_KL_LOSS = "actor/kl_loss"
ACTOR_ENTROPY = "actor/entropy"
ACTOR_GRAD_NORM = "actor/grad_norm"
ACTOR_PPO_KL = "actor/ppo_kl"
ACTOR_PG_CLIPFRAC = "actor/pg_clipfrac"

# --------------------------------------------------------------------------- rewards
REWARD_PREFIX = "reward/"
RULE_SCORE_MEAN = "reward/rule_score/mean"
RM_SCORE_MEAN = "reward/rm_score/mean"
OVERLONG_PENALTY_MEAN = "reward/overlong_penalty/mean"
OVERLONG_FRAC = "reward/overlong_frac"
REWARD_BASELINE_MEAN = "reward_baseline/mean"
REWARD_KL_PENALTY = "actor/reward_kl_penalty"
"""The mean per-row KL(old || ref) of the KL reward penalty (what the KL controller sees)."""
REWARD_KL_PENALTY_COEFF = "actor/reward_kl_penalty_coeff"

# --------------------------------------------------------------------------- dynamic sampling (DAPO)
DYNAMIC_SAMPLING_PREFIX = "dynamic_sampling/"
KEPT_GROUPS = "dynamic_sampling/kept_groups"
GROUPS = "dynamic_sampling/groups"
KEPT_GROUP_FRAC = "dynamic_sampling/kept_group_frac"
DYNAMIC_NUM_SAMPLES = "dynamic_sampling/num_samples"
NUM_GEN_BATCHES = "train/num_gen_batches"

# --------------------------------------------------------------------------- weight sync
RESHARD = "reshard"
"""The weight sync's node, and the substring the run keeps of its metrics."""
RESHARD_PREFIX = "reshard/"
RESHARD_BYTES = "reshard/bytes"
RESHARD_BYTES_MIN = "reshard/bytes_min"
RESHARD_PEAK_EXTRA_BYTES = "reshard/peak_extra_bytes"

# --------------------------------------------------------------------------- asynchronous RL (issue 15)
STALENESS_MEAN = "async/staleness_mean"  # trained version - generating version, over the step's samples
STALENESS_MAX = "async/staleness_max"
TRAINER_IDLE = "async/trainer_idle_s"  # the step's wall time the actor spent waiting (not in a call)
ROLLOUT_IDLE = "async/rollout_idle_s"  # time between the end of the previous generation and this one's start
QUEUE_DEPTH_MEAN = "async/queue_depth_mean"  # stream mode: generated groups waiting for the trainer, sampled over the step
QUEUE_DEPTH_MAX = "async/queue_depth_max"
STALE_SAMPLES = "async/stale_samples"  # stream mode: samples older than trainer.staleness versions, refused and generated again
PARTIAL_SAMPLES = "async/partial_samples"  # stream mode: samples whose tokens came from more than one weight version
ROLLOUT_CORR_PREFIX = "rollout_corr/"  # the rollout correction's (algorithm.rollout_is*), verl's names
ROLLOUT_CORR_KL = "rollout_corr/kl"
ROLLOUT_CORR_K3_KL = "rollout_corr/k3_kl"
ROLLOUT_CORR_IS_MEAN = "rollout_corr/rollout_is_mean"
ROLLOUT_CORR_IS_MAX = "rollout_corr/rollout_is_max"
ROLLOUT_CORR_IS_MIN = "rollout_corr/rollout_is_min"
ROLLOUT_CORR_FRACTION_HIGH = "rollout_corr/rollout_is_ratio_fraction_high"
ROLLOUT_CORR_FRACTION_LOW = "rollout_corr/rollout_is_ratio_fraction_low"
ROLLOUT_CORR_MASKED_FRACTION = "rollout_corr/rollout_is_masked_fraction"
ROLLOUT_CORR_VETO_FRACTION = "rollout_corr/rollout_is_veto_fraction"
CRITIC_WARMUP = "critic/warmup"  # 1.0 on a critic-only step (trainer.critic_warmup)

# --------------------------------------------------------------------------- validation
VALIDATION_PREFIX = "val-"
VAL_RESPONSE_LENGTH_MEAN = "val-aux/response_length/mean"
VAL_NUM_SAMPLES = "val-aux/num_samples"

# --------------------------------------------------------------------------- the dashboard's sections
PERF_GROUP = "perf"
RESHARD_GROUP = "reshard"

# --------------------------------------------------------------------------- multi-turn rollouts
AGENT_PREFIX = "agent/"
AGENT_NUM_TURNS_MEAN = "agent/num_turns/mean"
AGENT_TOOL_CALLS_MEAN = "agent/tool_calls/mean"
AGENT_TOOL_ERROR_FRAC = "agent/tool_error_frac"  # failed calls / calls (malformed ones included)
AGENT_WELL_FORMED_CALL_FRAC = "agent/well_formed_call_frac"  # calls the parser could read / calls
AGENT_TOOL_REWARD_MEAN = "agent/tool_reward/mean"


def agent_finish_reason(reason: str) -> str:
    """Fraction of trajectories that ended for ``reason`` (stop, length, max_turns)."""
    return f"agent/finish_reason/{reason}"


def timing(node: str) -> str:
    """Wall time of graph node ``node`` inside its task: ``timing_s/<node>``."""
    return f"timing_s/{node}"


def timing_per_token(node: str) -> str:
    """verl's per-token time of node ``node`` in milliseconds: ``timing_per_token_ms/<node>``."""
    return f"timing_per_token_ms/{node}"


#: verl's ``compute_timing_metrics``: the nodes timed per token, and over which tokens.
PER_TOKEN_RESPONSE_NODES = ("gen",)
PER_TOKEN_ALL_NODES = ("ref", "values", "adv", "update_critic", "update_actor")


def compute(what: str) -> str:
    """The slowest rank's time inside the actor method behind ``what``: ``compute_s/<what>``."""
    return f"compute_s/{what}"


def update_stat(prefix: str, stat: str) -> str:
    """One stat of an update, averaged over its optimizer steps: ``<prefix>/<stat>``
    (``prefix`` is :data:`ACTOR` or :data:`CRITIC`). The rollout correction's ``rollout_corr/*``,
    computed in the loss in bypass mode, stay as they are (verl's names)."""
    if stat.startswith(ROLLOUT_CORR_PREFIX):
        return stat
    return f"{prefix}/{stat}"


def reward_extra(key: str) -> str:
    """A reward function's extra value ``key`` (verl's dict return), averaged: ``reward/<key>``."""
    return f"{REWARD_PREFIX}{key}"


def val_mean(data_source: str, n: int) -> str:
    """Validation: mean score of all ``n`` responses per prompt of ``data_source``."""
    return f"val-core/{data_source}/reward/mean@{n}"


def val_best(data_source: str, n: int) -> str:
    """Validation: mean over the prompts of ``data_source`` of the best of their ``n`` scores."""
    return f"val-core/{data_source}/reward/best@{n}/mean"

"""verl's values and names that flowrl refuses by name, and the refusals they knock on: the
part of verl's key table (:mod:`flowrl.config.verl_keys`) that is about values, not keys."""

from __future__ import annotations

AR = "actor_rollout_ref"

#: verl values of a feature flowrl lacks: (flowrl key, value) -> (what it is, the fix).
REFUSED_VALUES: dict[tuple[str, str], tuple[str, str]] = {
    ("rollout.name", "sglang"): ("the SGLang rollout engine", "use one of hf, vllm"),
    ("rollout.name", "sglang_async"): ("the SGLang rollout engine", "use one of hf, vllm"),
    ("rollout.name", "trtllm"): ("the TensorRT-LLM rollout engine", "use one of hf, vllm"),
    ("trainer.device", "npu"): ("Ascend NPUs", "trainer.device=cuda"),
}

#: verl 0.9.1's names of a kind (``AdvantageEstimator``, ``register_policy_loss``,
#: ``Tracking.supported_backend``), by flowrl key: a verl name flowrl lacks is refused as that
#: missing feature, by name (:func:`flowrl.config.verl.verl_value`).
VERL_NAMES: dict[str, tuple[str, tuple[str, ...]]] = {
    "algorithm.adv_estimator": ("advantage estimator", (
        "gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "opo", "grpo_passk",
        "gpg", "rloo_vectorized", "grpo_vectorized", "optimal_token_baseline", "tir_optimal_token_baseline", "gdpo")),
    "actor.policy_loss": ("policy loss", (
        "vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo",
        "bypass_mode")),
    "trainer.logger": ("logger", (
        "wandb", "mlflow", "swanlab", "vemlp_wandb", "tensorboard", "console", "clearml", "trackio", "file",
        "rl_insight")),
}

_ENGINE_SETTINGS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
                    "gpu_memory_utilization", "free_cache_engine", "enforce_eager", "max_num_batched_tokens",
                    "enable_chunked_prefill")
#: a refusal by name (a REFUSED_VALUES key or a table key) -> the flowrl settings whose checks fail
#: only because of it: withheld once it is reported, so that the list holds the named refusal and
#: no second, misleading one (:func:`flowrl.config.verl_load.translate_all`).
KNOCK_ON: dict[str, tuple[str, ...]] = {
    # SGLang / TensorRT-LLM refused: flowrl's default engine (hf) would judge the engine's sizes and knobs
    "rollout.name": tuple(f"rollout.{name}" for name in _ENGINE_SETTINGS),
    # verl's tool config refused: rollout.multi_turn.enable would be left without tools
    f"{AR}.rollout.multi_turn.*": ("rollout.multi_turn.enable",),
}

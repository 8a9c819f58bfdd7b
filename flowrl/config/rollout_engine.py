"""The vLLM engine's own settings of the rollout section (verl's names and meanings):
``rollout.max_num_seqs``, ``rollout.max_model_len``, ``rollout.enable_prefix_caching`` and
``rollout.engine_kwargs`` (verl's ``engine_kwargs.vllm.*``, passed to ``vllm.LLM`` last), checked
when the config is loaded.

``rollout.engine_kwargs`` refuses the ``vllm.LLM`` arguments flowrl sets itself and relies on
(:data:`RESERVED_ENGINE_KWARGS`): each is named with the flowrl key that sets it, or why none does.
The rules about these keys apply where ``rollout.name`` owns them (its backend spec's
``config_keys``: vllm); another backend leaves them unread, as it does ``rollout.enforce_eager``.
``max_model_len`` against ``data.max_prompt_length + rollout.response_length`` is checked where
both sections meet (:func:`check_max_model_len`).
"""

from __future__ import annotations

from typing import Any

from flowrl.config.errors import ConfigError, check

__all__ = ["RESERVED_ENGINE_KWARGS", "check_engine_settings", "check_max_model_len", "max_model_len",
           "max_num_seqs"]

#: ``vllm.LLM`` arguments that flowrl sets and relies on -> the flowrl key that sets it (or why none).
RESERVED_ENGINE_KWARGS: dict[str, str] = {
    "model": "model.path",
    "tokenizer": "model.path (prompts and responses are token ids: skip_tokenizer_init)",
    "skip_tokenizer_init": "none: flowrl sends and reads token ids (false only for a vision-language model)",
    "dtype": "model.dtype",
    "seed": "trainer.seed (each generate call also seeds the batch)",
    "tensor_parallel_size": "rollout.tensor_model_parallel_size",
    "pipeline_parallel_size": "rollout.tensor_model_parallel_size (flowrl's vLLM replicas are tensor-parallel only)",
    "load_format": "none: flowrl starts the engine without reading weights and syncs the trainer's",
    "worker_extension_cls": "none: flowrl's weight sync, seeding and LoRA run through its worker extension",
    "distributed_executor_backend": "none: flowrl picks it (external_launcher inside the trainer's group)",
    "logprobs_mode": "none: the rollout's log-probs are vLLM's processed_logprobs, the trainer's temperature",
    "weight_transfer_config": "none: flowrl's weight sync chooses it (CUDA IPC on a GPU)",
    "enable_sleep_mode": "rollout.free_cache_engine",
    "enable_lora": "model.lora_rank", "max_lora_rank": "model.lora_rank", "max_loras": "model.lora_rank",
    "max_cpu_loras": "model.lora_rank",
    "limit_mm_per_prompt": "none: flowrl sets it from the model (a vision-language model's images per prompt)",
    "gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "enforce_eager": "rollout.enforce_eager",
    "max_num_seqs": "rollout.max_num_seqs",
    "max_model_len": "rollout.max_model_len",
    "enable_prefix_caching": "rollout.enable_prefix_caching",
    "max_num_batched_tokens": "rollout.max_num_batched_tokens",
    "enable_chunked_prefill": "rollout.enable_chunked_prefill",
}


def check_engine_settings(rollout: Any, *, owned: bool) -> None:
    """The section's engine settings (``owned``: ``rollout.name``'s backend reads them)."""
    for name in ("max_num_seqs", "max_model_len"):
        value = getattr(rollout, name)
        check(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1), name, value,
              "must be an integer >= 1, or null", f"use null (derived; see flowrl config --fields) or e.g. {name}=256")
    check(isinstance(rollout.enable_prefix_caching, bool), "enable_prefix_caching", rollout.enable_prefix_caching,
          "must be true or false", "use true (the n samples of a prompt share its KV cache)")
    extra = rollout.engine_kwargs
    check(isinstance(extra, dict) and all(isinstance(k, str) for k in extra), "engine_kwargs", extra,
          "must be a mapping of vllm.LLM argument names to values", "write rollout.engine_kwargs.<name>=<value>")
    if not owned:
        return
    for name, value in extra.items():
        if name in RESERVED_ENGINE_KWARGS:
            owner = RESERVED_ENGINE_KWARGS[name]
            fix = f"drop it ({owner[6:]})" if owner.startswith("none") else f"drop it and set {owner.split(' (')[0]}"
            raise ConfigError(f"engine_kwargs.{name}", value, "is a vllm.LLM argument flowrl sets itself", fix)
    budget = rollout.max_num_batched_tokens
    check(budget >= max_num_seqs(rollout), "max_num_batched_tokens", budget,
          f"must be >= vLLM's max_num_seqs={max_num_seqs(rollout)} (rollout.max_num_seqs, or rollout.micro_batch_size "
          "when null): vLLM refuses a smaller step budget",
          f"set rollout.max_num_batched_tokens={max(8192, max_num_seqs(rollout))}, or a smaller max_num_seqs")


def max_num_seqs(rollout: Any) -> int:
    """vLLM's ``max_num_seqs``: ``rollout.max_num_seqs``, or ``rollout.micro_batch_size`` (the
    sequences of one generate call) when null."""
    return rollout.max_num_seqs if rollout.max_num_seqs is not None else rollout.micro_batch_size


def max_model_len(rollout: Any, *, max_prompt_length: int) -> int:
    """vLLM's ``max_model_len``: ``rollout.max_model_len``, or the longest sequence a rollout makes
    (``data.max_prompt_length + rollout.response_length``) when null."""
    check_max_model_len(rollout, max_prompt_length=max_prompt_length)
    longest = max_prompt_length + rollout.response_length
    return rollout.max_model_len if rollout.max_model_len is not None else longest


def check_max_model_len(rollout: Any, *, max_prompt_length: int) -> None:
    """``rollout.max_model_len``, if set, holds the longest sequence a rollout makes (vLLM refuses a
    longer prompt, and stops a response at the context's end)."""
    longest = max_prompt_length + rollout.response_length
    check(rollout.max_model_len is None or rollout.max_model_len >= longest, "rollout.max_model_len",
          rollout.max_model_len, f"is shorter than data.max_prompt_length={max_prompt_length} + "
          f"rollout.response_length={rollout.response_length} = {longest}, the longest sequence a rollout makes",
          f"set rollout.max_model_len={longest} or more, or null (that sum)")

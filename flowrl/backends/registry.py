"""The backend catalogue: every engine by name and import string, with the traits the rest of the
code reads instead of comparing backend names. Torch-free: nothing here imports an engine.

Traits of a train backend (``TRAIN_BACKENDS``, ``actor.strategy`` / ``ref.strategy``):

* ``checkpoint``: ``"full"`` (every rank holds the full state; rank 0 writes it,
  :class:`~flowrl.backends.interfaces.FullCheckpointEngine`) or ``"sharded"`` (each rank writes
  its own chunks, :class:`~flowrl.backends.interfaces.ShardedCheckpointEngine`).
* ``shard_style``: the ``flowrl.parallel.shard_spec`` style of ``reshard_source()``.
* ``engine_kwargs``: import string of ``fn(group_cfg) -> dict``, the engine's keyword arguments
  beyond the common ones (mesh settings); None: none.
* ``preflight``: import string of ``fn(cfg, *, model_path) -> None`` raising
  ``flowrl.config.ConfigError`` before any worker starts (layouts against the model); None: none.
* ``checkpointable``: import string of ``fn(group_cfg) -> (problem, fix) | None``: why this
  group's state cannot be checkpointed (megatron's distributed optimizer); None: always can.
* ``model_kwargs`` (optional): import string of ``fn(model_cfg) -> dict``, the trained policy's
  engine arguments from ``model.*`` (gradient checkpointing); absent: the backend takes none and
  pre-flight refuses ``model.enable_gradient_checkpointing``.
* ``lora`` (optional): import string of ``fn(cfg, *, model_path) -> None``, the pre-flight check of
  ``model.lora_*`` for a backend whose engine takes ``lora=`` (peft adapters, the reference as the
  base model with adapters disabled); absent: pre-flight refuses ``model.lora_rank`` > 0.

Value backends (``VALUE_BACKENDS``, ``critic.strategy``): ``checkpoint`` (``"full"``, ``"sharded"``,
or None: no critic checkpoints yet, refused in pre-flight), ``engine_kwargs`` and ``preflight`` as above
(``model_path``: the critic's model).

Generation backends (``GEN_BACKENDS``, ``rollout.name``): ``shard_style`` (of the reshard's
destination), ``reshard`` (``"in_place"``: the engine offers ``reshard_target()``; ``"staged"``:
staging tensors assembled on each replica's engine rank and loaded with ``load_hf_state``),
``role_kwargs`` (import string of ``fn(rollout_cfg, *, max_prompt_length, seed) -> dict``, extra
``RolloutRole`` keyword arguments; None: none) and ``preflight`` (import string of
``fn(rollout_cfg, *, model_path) -> None`` raising ``ConfigError``, e.g. vLLM not installed or
the model's head size unsupported; ``model_path`` may be None; None: none).

Adding a backend: a class implementing the Protocol of ``flowrl.backends.interfaces``, one
``register`` line here with its traits; the config then accepts its name.
"""

from __future__ import annotations

from flowrl.registry import Registry

__all__ = ["GEN_BACKENDS", "TRAIN_BACKENDS", "VALUE_BACKENDS"]

_MEGATRON = "flowrl.backends.train.megatron.options"
_FSDP = "flowrl.backends.train.fsdp_options"
_LORA = "flowrl.backends.train.lora"

TRAIN_BACKENDS: Registry = Registry("train backend")
TRAIN_BACKENDS.register(
    "dp", "flowrl.backends.train.dp_policy:TorchDPEngine",
    checkpoint="full", shard_style="hf", engine_kwargs=None, preflight=None, checkpointable=None,
    lora=f"{_LORA}:check_lora",
)
TRAIN_BACKENDS.register(
    "megatron", "flowrl.backends.train.megatron.policy:MegatronTrainEngine",
    checkpoint="sharded", shard_style="megatron", engine_kwargs=f"{_MEGATRON}:train_engine_kwargs",
    preflight=f"{_MEGATRON}:check_train_layouts", checkpointable=f"{_MEGATRON}:checkpoint_problem",
)
TRAIN_BACKENDS.register(
    "fsdp", "flowrl.backends.train.fsdp_policy:FSDPEngine",
    checkpoint="sharded", shard_style="hf", engine_kwargs=f"{_FSDP}:engine_kwargs", preflight=f"{_FSDP}:check_fsdp",
    checkpointable=None, model_kwargs=f"{_FSDP}:model_kwargs", lora=f"{_LORA}:check_lora",
)

VALUE_BACKENDS: Registry = Registry("value backend")
VALUE_BACKENDS.register(
    "dp", "flowrl.backends.train.dp_value:TorchDPValueEngine",
    checkpoint="full", engine_kwargs=None, preflight=None,
)
VALUE_BACKENDS.register(
    "megatron", "flowrl.backends.train.megatron.value:MegatronValueTrainEngine",
    checkpoint=None, engine_kwargs=f"{_MEGATRON}:value_engine_kwargs", preflight=f"{_MEGATRON}:check_value_layout",
)
VALUE_BACKENDS.register(
    "fsdp", "flowrl.backends.train.fsdp_value:FSDPValueEngine",
    checkpoint="sharded", engine_kwargs=f"{_FSDP}:engine_kwargs", preflight=f"{_FSDP}:check_fsdp_critic",
)

GEN_BACKENDS: Registry = Registry("generation backend")
GEN_BACKENDS.register(
    "hf", "flowrl.backends.generate.hf:HFGenerator",
    shard_style="hf", reshard="in_place", role_kwargs=None, preflight=None,
)
GEN_BACKENDS.register(
    "vllm", "flowrl.backends.generate.vllm:VLLMGenerator",
    shard_style="vllm", reshard="staged", role_kwargs="flowrl.backends.generate.vllm:vllm_role_kwargs",
    preflight="flowrl.backends.generate.vllm:check_installed",
)

"""verl's configuration keys: the one table that maps them onto flowrl's.

:data:`VERL_KEYS` is the single source of the mapping, read by the loader (verl keys on a
``flowrl train`` command line or in a verl YAML), by ``flowrl config --from-verl`` (the flowrl form
of a verl command line) and by the suggestions of an unknown key. An entry is one of

* ``map``: the value goes to the flowrl key (``.*`` entries map a whole sub-tree by prefix);
* ``dyn``: as ``map`` once the flowrl field exists (checked with ``dataclasses.fields`` when the
  config is built, so FSDP keys work the moment ``actor.fsdp_config`` lands); until then the
  ``accept`` values (what flowrl already does) pass and any other value is refused as not
  implemented yet;
* ``noop``: accepted, and the note says why it changes nothing in flowrl;
* ``refuse``: no flowrl equivalent: refused, naming what it does in verl and the nearest flowrl
  setting, unless the value is one of ``accept`` (verl's "off", which is flowrl's behaviour);
* ``derive``: read together with other keys by :func:`derive` (GPU counts, the custom reward
  function's path and name, ``resume_from_path``).

``verl`` (the last column) is verl's default where it differs from flowrl's: the run prints these
differences once at start when ``model.path`` is set (see :func:`default_differences`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from flowrl.config.errors import ConfigError

_NO = object()  # no verl default recorded


@dataclass(frozen=True)
class VerlKey:
    verl: str
    kind: str  # map | dyn | noop | refuse | derive
    flowrl: str = ""
    does: str = ""
    nearest: str = ""
    accept: tuple = ()
    verl_default: Any = _NO
    adopt: bool = True  # a verl YAML's default value of this key is applied (False: flowrl's stays)


def _k(verl: str, kind: str, flowrl: str = "", does: str = "", nearest: str = "", accept: tuple = (),
       default: Any = _NO, adopt: bool = True) -> VerlKey:
    return VerlKey(verl, kind, flowrl, does, nearest, accept, default, adopt)


_OFF = (False, None, 0, 0.0, "", "none", "null")
AR = "actor_rollout_ref"

#: verl key -> flowrl key (or why not). Exact keys win over ``.*`` prefixes; longer prefixes win.
VERL_KEYS: tuple[VerlKey, ...] = (
    # --- prefixes: actor_rollout_ref.{actor,rollout,ref,model}.* -> actor.*, rollout.*, ref.*, model.*
    _k(f"{AR}.actor.*", "map", "actor.*"),
    _k(f"{AR}.rollout.*", "map", "rollout.*"),
    _k(f"{AR}.ref.*", "map", "ref.*"),
    _k(f"{AR}.model.*", "map", "model.*"),
    # --- data
    _k("data.max_response_length", "map", "rollout.response_length", default=512),
    _k("data.max_prompt_length", "map", "data.max_prompt_length", default=512),
    _k("data.train_batch_size", "map", "data.train_batch_size", default=1024),
    _k("data.filter_overlong_prompts", "map", "data.filter_overlong_prompts", default=False),
    _k("data.val_batch_size", "noop", does="validation batch size (deprecated in verl)",
       nearest="flowrl validates all of data.val_files in one graph"),
    _k("data.return_raw_chat", "noop", does="keeps the raw chat for the rollout",
       nearest="flowrl renders the chat template once, at load"),
    _k("data.dataloader_num_workers", "noop", does="torch DataLoader workers", nearest="flowrl tokenizes once at start"),
    _k("data.reward_fn_key", "refuse", does="the column that selects the reward function",
       nearest="algorithm.reward_fn (auto picks by data_source)", accept=("data_source",)),
    _k("data.seed", "map", "trainer.seed"),
    # --- model
    _k(f"{AR}.model.use_remove_padding", "noop", does="packed (padding-free) forward passes, a speed option",
       nearest="none needed: experience is stored ragged and each micro-batch is padded only to its "
               "longest row; the results are the same"),
    _k(f"{AR}.model.enable_gradient_checkpointing", "dyn", "model.enable_gradient_checkpointing",
       does="recomputes activations in the backward pass to save memory",
       nearest="lower actor.ppo_micro_batch_size_per_gpu (less activation memory)", accept=_OFF),
    _k(f"{AR}.model.external_lib", "refuse", does="imports a module that registers a custom model",
       nearest="model.path of a transformers directory", accept=_OFF),
    _k(f"{AR}.model.trust_remote_code", "refuse", does="runs a model repository's own code",
       nearest="model.path of a Llama/Qwen2-family directory", accept=_OFF),
    # --- actor
    _k(f"{AR}.actor.strategy", "dyn", "actor.strategy", does="the training engine (fsdp, fsdp2, megatron)",
       nearest="actor.strategy=dp (data parallel) or megatron"),
    _k(f"{AR}.actor.fsdp_config.*", "dyn", "actor.fsdp_config.*", does="FSDP sharding and CPU offload of the actor",
       nearest="actor.strategy=dp (nothing offloaded)", accept=_OFF),
    _k(f"{AR}.ref.fsdp_config.*", "dyn", "ref.fsdp_config.*", does="FSDP sharding and CPU offload of the reference",
       nearest="ref.data_parallel_size (the reference keeps its weights on its own workers)", accept=_OFF),
    _k("critic.model.fsdp_config.*", "dyn", "critic.fsdp_config.*", does="FSDP sharding and CPU offload of the critic",
       nearest="critic.strategy=dp (nothing offloaded)", accept=_OFF),
    _k(f"{AR}.actor.grad_clip", "map", "actor.optim.grad_clip"),
    _k(f"{AR}.actor.policy_loss.loss_mode", "map", "actor.policy_loss"),
    _k(f"{AR}.actor.policy_loss.*", "refuse", does="options of verl's policy losses",
       nearest="actor.policy_loss, actor.clip_ratio_low/high/c", accept=_OFF),
    _k(f"{AR}.actor.clip_ratio", "derive", does="sets clip_ratio_low and clip_ratio_high together"),
    _k(f"{AR}.actor.ppo_micro_batch_size", "refuse", does="the global micro-batch size (deprecated in verl)",
       nearest="actor.ppo_micro_batch_size_per_gpu", accept=_OFF),
    _k(f"{AR}.actor.use_dynamic_bsz", "map", "actor.use_dynamic_bsz", default=False),
    _k(f"{AR}.actor.ppo_max_token_len_per_gpu", "map", "actor.ppo_max_token_len_per_gpu", default=16384),
    _k(f"{AR}.actor.use_prefix_grouper", "map", "actor.use_prefix_grouper"),  # verl: False, and not with use_dynamic_bsz
    _k(f"{AR}.rollout.log_prob_use_dynamic_bsz", "map", "actor.log_prob_use_dynamic_bsz"),
    _k(f"{AR}.rollout.log_prob_max_token_len_per_gpu", "map", "actor.log_prob_max_token_len_per_gpu"),
    # lr_scheduler_type, lr_warmup_steps(_ratio), min_lr_ratio, num_cycles map by the actor.* prefix
    _k(f"{AR}.actor.optim.warmup_style", "map", "actor.optim.lr_scheduler_type"),  # verl's deprecated name
    _k("critic.optim.warmup_style", "map", "critic.optim.lr_scheduler_type"),
    _k(f"{AR}.actor.optim.weight_decay", "map", "actor.optim.weight_decay", default=0.01),
    _k(f"{AR}.actor.optim.betas", "map", "actor.optim.betas", default=(0.9, 0.999)),
    _k(f"{AR}.actor.optim.lr", "map", "actor.optim.lr", default=1e-6),
    _k(f"{AR}.actor.ppo_mini_batch_size", "map", "actor.ppo_mini_batch_size", default=256),
    _k(f"{AR}.actor.use_kl_loss", "map", "actor.use_kl_loss", default=False),
    # --- rollout
    _k(f"{AR}.rollout.log_prob_micro_batch_size_per_gpu", "noop",
       does="the micro-batch of the old-log-prob pass", nearest="flowrl's actor uses actor.ppo_micro_batch_size_per_gpu"),
    _k(f"{AR}.rollout.log_prob_micro_batch_size", "noop", does="the global micro-batch of the old-log-prob pass",
       nearest="actor.ppo_micro_batch_size_per_gpu"),
    _k(f"{AR}.rollout.prompt_length", "noop", does="the rollout's prompt budget (= data.max_prompt_length in verl)",
       nearest="data.max_prompt_length"),
    _k(f"{AR}.rollout.max_num_batched_tokens", "map", "rollout.max_num_batched_tokens"),
    _k(f"{AR}.rollout.mode", "refuse", does="sync or async (agent-loop) rollout", nearest="rollout.name",
       accept=("sync", "async")),
    _k(f"{AR}.rollout.data_parallel_size", "noop", does="the rollout's data-parallel size, which verl derives "
       "from the GPUs", nearest="trainer.n_gpus_per_node (or flowrl's rollout.data_parallel_size)"),
    _k(f"{AR}.rollout.n", "map", "rollout.n", default=1),
    # verl's rollout dtype is the generation engine's; flowrl's model.dtype is every engine's compute
    # dtype. A verl YAML's default (bfloat16) is not adopted: flowrl's auto is bf16 on GPU already.
    _k(f"{AR}.rollout.dtype", "map", "model.dtype", default="bfloat16", adopt=False),
    _k(f"{AR}.rollout.response_length", "map", "rollout.response_length", default=512),
    _k(f"{AR}.rollout.free_cache_engine", "map", "rollout.free_cache_engine", default=True,
       adopt=False),  # vllm only: verl's default would refuse rollout.name=hf
    # --- ref
    _k(f"{AR}.ref.log_prob_micro_batch_size", "noop", does="the reference's global micro-batch",
       nearest="ref.log_prob_micro_batch_size_per_gpu"),
    # --- critic and reward model
    _k("critic.model.path", "map", "critic.model_path"),
    _k("critic.model.*", "refuse", does="the critic's model options", nearest="critic.model_path", accept=_OFF),
    _k("critic.grad_clip", "map", "critic.optim.grad_clip"),
    _k("critic.ppo_micro_batch_size", "refuse", does="the critic's global micro-batch (deprecated)",
       nearest="critic.ppo_micro_batch_size_per_gpu", accept=_OFF),
    _k("reward_model.model.path", "map", "reward_model.model_path"),
    _k("reward_model.model.input_tokenizer", "refuse", does="re-tokenises responses for a reward model with "
       "another tokenizer", nearest="a reward model sharing the policy's tokenizer", accept=_OFF),
    _k("reward_model.reward_manager", "refuse", does="how rule rewards are computed (naive, prime, dapo, ...)",
       nearest="algorithm.reward_fn; reward_model.overlong_buffer for DAPO", accept=("naive", None)),
    _k("sandbox_fusion.*", "map", "sandbox.*"),  # url, max_concurrent, memory_limit_mb (issue 38)
    _k("reward.sandbox_fusion.*", "map", "sandbox.*"),
    _k("reward_model.sandbox_fusion.*", "map", "sandbox.*"),
    _k("custom_reward_function.path", "derive", does="a Python file holding your reward function"),
    _k("custom_reward_function.name", "derive", does="the reward function's name in that file"),
    _k("custom_reward_function.reward_kwargs", "refuse", does="keyword arguments for the reward function",
       nearest="functools.partial in your module, named by algorithm.reward_fn", accept=({}, None)),
    # --- trainer
    _k("trainer.n_gpus_per_node", "derive", does="GPUs per node (with nnodes: the data-parallel sizes)"),
    _k("trainer.nnodes", "derive", does="nodes (with n_gpus_per_node: the data-parallel sizes)"),
    _k("trainer.resume_from_path", "derive", does="the checkpoint of resume_mode=resume_path"),
    _k("trainer.total_epochs", "map", "trainer.total_epochs", default=30),
    _k("trainer.val_before_train", "map", "trainer.val_before_train", default=True),
    _k("trainer.default_local_dir", "map", "trainer.run_dir"),
    _k("trainer.total_training_steps", "map", "trainer.total_training_steps"),
    _k("trainer.test_freq", "map", "trainer.test_freq"),  # verl's -1 (never) is flowrl's 0 too
    _k("trainer.device", "refuse", does="the accelerator kind", nearest="flowrl uses CUDA when present",
       accept=("cuda", "cpu")),
    _k("trainer.balance_batch", "noop", does="reorders samples to balance tokens over data-parallel ranks",
       nearest="none: flowrl splits rows evenly"),
    _k("trainer.log_val_generations", "noop", does="validation samples printed to the logger",
       nearest="flowrl writes every validation sample to <run_dir>/validation/"),
    _k("trainer.val_only", "refuse", does="validates and exits", nearest="trainer.test_freq", accept=_OFF),
    _k("trainer.ray_wait_register_center_timeout", "noop", does="Ray start-up timeout", nearest="cluster.timeout_s"),
    _k("trainer.del_local_ckpt_after_load", "refuse", does="deletes a checkpoint once loaded",
       nearest="trainer.max_ckpt_to_keep", accept=_OFF),
    _k("trainer.max_actor_ckpt_to_keep", "map", "trainer.max_ckpt_to_keep"),
    _k("trainer.max_critic_ckpt_to_keep", "map", "trainer.max_ckpt_to_keep"),
    _k("trainer.profile_steps", "refuse", does="Nsight profiling of steps", nearest="flowrl dashboard RUN_DIR",
       accept=_OFF),
    _k("model_engine", "refuse", does="the engine family of verl's actor, ref and critic configs",
       nearest="actor.strategy", accept=("dp",)),
    _k("ray_init.*", "noop", does="ray.init options", nearest="cluster.* (flowrl runs on Dask)"),
    _k("ray_kwargs.*", "noop", does="ray.init options", nearest="cluster.* (flowrl runs on Dask)"),
    _k("global_profiler.*", "refuse", does="verl's profilers", nearest="flowrl dashboard RUN_DIR", accept=_OFF),
)

#: verl's values that flowrl spells otherwise: applied to translated verl keys and to a verl
#: YAML's keys at their default.
VALUE_ALIASES: dict[tuple[str, Any], Any] = {
    ("trainer.save_freq", -1): 0, ("trainer.test_freq", -1): 0,  # verl's -1: never
    ("actor.strategy", "fsdp2"): "fsdp",  # flowrl's fsdp strategy is FSDP2
    ("model.dtype", "bf16"): "bfloat16", ("model.dtype", "fp32"): "float32",  # verl's short dtype names
}

_EXACT = {e.verl: e for e in VERL_KEYS if not e.verl.endswith(".*")}
_PREFIXES = sorted((e for e in VERL_KEYS if e.verl.endswith(".*")), key=lambda e: -len(e.verl))
VERL_SECTIONS = ("actor_rollout_ref", "custom_reward_function", "ray_init", "ray_kwargs", "global_profiler")


def lookup(key: str) -> tuple[VerlKey | None, str]:
    """The table's entry for verl key ``key`` and the flowrl key it maps to (``""`` if none)."""
    entry = _EXACT.get(key)
    if entry is None:
        entry = next((e for e in _PREFIXES if key.startswith(e.verl[:-1])), None)
    if entry is None:
        return None, ""
    if entry.verl.endswith(".*") and entry.flowrl.endswith(".*"):
        return entry, entry.flowrl[:-1] + key[len(entry.verl) - 1:]
    return entry, entry.flowrl


def field_exists(dotted: str) -> bool:
    """``dotted`` names a field of :class:`~flowrl.config.schema.RunConfig` (checked when called)."""
    from flowrl.config.schema import RunConfig

    cls: Any = RunConfig
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            return False
        match = {f.name: f for f in dataclasses.fields(cls)}.get(part)
        if match is None:
            return False
        cls = _dataclass_of(match)
    return True


def _dataclass_of(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return type(value) if dataclasses.is_dataclass(value) else None
    return None


def _refusal(key: str, value: Any, entry: VerlKey, *, pending: bool) -> ConfigError:
    what = f"in verl: {entry.does}" if entry.does else "a verl key"
    state = f"flowrl's {entry.flowrl} is not implemented yet" if pending else "flowrl has no equivalent"
    accepted = f" (accepted: {', '.join(map(repr, entry.accept[:3]))})" if entry.accept else ""
    return ConfigError(key, value, f"{what}; {state}{accepted}", f"drop it; nearest flowrl setting: {entry.nearest}")


def translate_item(key: str, value: Any) -> tuple[str | None, str | None]:
    """``(flowrl key or None, note or None)`` for one verl key; raises :class:`ConfigError` for a
    refused key. A key absent from the table comes back unchanged (the loader checks it)."""
    return _translate(key, value)


def alias(target: str, value: Any) -> Any:
    """``value`` in flowrl's spelling for flowrl key ``target`` (:data:`VALUE_ALIASES`)."""
    try:
        return VALUE_ALIASES.get((target, value), value)
    except TypeError:  # a list or dict value
        return value


def translate_default(key: str, value: Any) -> tuple[str | None, str | None]:
    """:func:`translate_item` for a verl YAML's key left at verl's default: ``None`` where the
    table says flowrl keeps its own default (``adopt=False``)."""
    entry, _ = lookup(key)
    if entry is not None and not entry.adopt:
        return None, None
    return _translate(key, value)


def _translate(key: str, value: Any) -> tuple[str | None, str | None]:
    entry, target = lookup(key)
    if entry is None:
        return key, None
    if entry.kind == "derive":  # read by derive()
        return None, None
    if entry.kind == "map":
        return target, None
    if entry.kind == "noop":
        return None, f"{key}={value!r}: accepted, changes nothing in flowrl ({entry.does}; {entry.nearest})"
    if entry.kind == "dyn":
        if entry.flowrl == "actor.strategy":
            if _strategy_known(alias(target, value)):
                return target, None
            raise _refusal(key, value, entry, pending=True)
        if field_exists(target):
            return target, None
        if _accepted(value, entry.accept):
            return None, f"{key}={value!r}: accepted, flowrl already behaves so"
        raise _refusal(key, value, entry, pending=True)
    if _accepted(value, entry.accept):
        return None, None
    raise _refusal(key, value, entry, pending=False)


def _accepted(value: Any, accept: tuple) -> bool:
    """``value`` is one of ``accept`` (booleans only as themselves: ``0`` is not ``False``)."""
    for a in accept:
        if isinstance(value, bool) or isinstance(a, bool):
            if value is a:
                return True
        elif type(value) is type(a) or isinstance(value, (int, float)) and isinstance(a, (int, float)):
            if value == a:
                return True
    return False


def _strategy_known(value: Any) -> bool:
    from flowrl.catalog.backends import TRAIN_BACKENDS

    return str(value) in TRAIN_BACKENDS.names()


def derive(flat: dict[str, Any]) -> dict[str, Any]:
    """The flowrl keys that several verl keys make together (``derive`` entries)."""
    out: dict[str, Any] = {}
    clip = flat.get(f"{AR}.actor.clip_ratio")
    if clip is not None:
        out["actor.clip_ratio_low"] = out["actor.clip_ratio_high"] = clip
    path = flat.get("custom_reward_function.path") or flat.get("reward.custom_reward_function.path")
    if path:
        name = flat.get("custom_reward_function.name") or flat.get("reward.custom_reward_function.name") or "compute_score"
        out["algorithm.reward_fn"] = f"{path}:{name}"
    if flat.get("trainer.resume_mode") == "resume_path":
        out["trainer.resume_mode"] = flat.get("trainer.resume_from_path") or ""
    if any(k.startswith(f"{AR}.") for k in flat) and f"{AR}.actor.strategy" not in flat and "actor.strategy" not in flat:
        if _strategy_known("fsdp"):  # verl's default engine, where flowrl has it
            out["actor.strategy"] = "fsdp"
    gpus = flat.get("trainer.n_gpus_per_node")
    if gpus is not None:
        world = int(gpus) * int(flat.get("trainer.nnodes") or 1)
        out.update(_data_parallel_sizes(flat, world))
    return out


def _data_parallel_sizes(flat: dict[str, Any], world: int) -> dict[str, Any]:
    """verl colocates every role on all ``world`` GPUs: each group's data-parallel size is what is
    left of them after its tensor and pipeline split."""
    sizes = {}
    groups = [("actor", f"{AR}.actor"), ("ref", f"{AR}.actor"), ("rollout", f"{AR}.rollout")]
    if flat.get("algorithm.adv_estimator") == "gae":
        groups.append(("critic", "critic"))
    for group, prefix in groups:
        tp = int(flat.get(f"{prefix}.megatron.tensor_model_parallel_size") or flat.get(f"{prefix}.tensor_model_parallel_size") or 1)
        pp = int(flat.get(f"{prefix}.megatron.pipeline_model_parallel_size") or 1)
        if world % (tp * pp):
            raise ConfigError("trainer.n_gpus_per_node", world, f"is not divisible by {group}'s tensor x pipeline "
                              f"split {tp}x{pp}", "choose GPU counts that the tensor/pipeline sizes divide")
        sizes[f"{group}.data_parallel_size"] = world // (tp * pp)
    return sizes


def default_differences(cfg: Any, set_keys: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """``key=flowrl value (verl's default)`` for each table key whose verl default differs from
    flowrl's and that ``cfg`` leaves at flowrl's default, not named in ``set_keys`` (printed once
    when ``model.path`` is set: flowrl keeps its small defaults, and says where they are not
    verl's)."""
    from flowrl.config.schema import RunConfig

    fresh = RunConfig()
    out, seen = [], set(set_keys)
    for entry in VERL_KEYS:
        if entry.verl_default is _NO or not entry.flowrl or entry.flowrl.endswith("*") or entry.flowrl in seen:
            continue
        seen.add(entry.flowrl)
        ours = _get(cfg, entry.flowrl)
        default = _get(fresh, entry.flowrl)
        verl_value = tuple(entry.verl_default) if isinstance(default, tuple) else entry.verl_default
        if ours == default and default != verl_value:
            out.append(f"{entry.flowrl}={default!r} (verl's {entry.verl} defaults to {entry.verl_default!r})")
    return out


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg

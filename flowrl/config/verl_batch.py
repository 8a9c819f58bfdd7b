"""verl's batch-size arithmetic: its global (deprecated) micro-batch sizes as flowrl's per-GPU ones.

verl's workers normalise a global micro-batch to a per-GPU one before they train
(``fsdp_workers.ActorRolloutRefWorker._normalize`` of verl <= 0.5:
``ppo_micro_batch_size //= device_mesh.size() // ulysses_sequence_parallel_size``, then
``ppo_micro_batch_size_per_gpu = ppo_micro_batch_size``; ``megatron_workers``: ``//=
mpu.get_data_parallel_world_size()``). The GPUs are ``trainer.n_gpus_per_node * trainer.nnodes``
(verl's defaults: 8 and 1), as every role is colocated on all of them. verl 0.9.1 still accepts the
global keys and checks them (``ActorConfig.validate``: the mini-batch a multiple of the micro-batch,
``micro * ulysses_size >= n_gpus``), so the same checks hold here. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from flowrl.config.errors import ConfigError

AR = "actor_rollout_ref"
VERL_GPUS_PER_NODE = 8  # verl's trainer.n_gpus_per_node default

#: verl's global micro-batch key -> (flowrl's per-GPU key, verl's per-GPU key, the Ulysses size that
#: groups GPUs, verl's prefix of the group's Megatron sizes, verl's mini-batch key or "")
GLOBAL_MICRO_BATCHES: dict[str, tuple[str, str, str, str, str]] = {
    f"{AR}.actor.ppo_micro_batch_size": (
        "actor.ppo_micro_batch_size_per_gpu", f"{AR}.actor.ppo_micro_batch_size_per_gpu",
        f"{AR}.actor.ulysses_sequence_parallel_size", f"{AR}.actor", f"{AR}.actor.ppo_mini_batch_size"),
    f"{AR}.ref.log_prob_micro_batch_size": (
        "ref.log_prob_micro_batch_size_per_gpu", f"{AR}.ref.log_prob_micro_batch_size_per_gpu",
        f"{AR}.ref.ulysses_sequence_parallel_size", f"{AR}.ref", ""),
    "critic.ppo_micro_batch_size": (
        "critic.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu",
        "critic.ulysses_sequence_parallel_size", "critic", "critic.ppo_mini_batch_size"),
    "critic.forward_micro_batch_size": (
        "critic.forward_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu",
        "critic.ulysses_sequence_parallel_size", "critic", ""),
}


def num_gpus(flat: dict[str, Any]) -> int:
    """``trainer.n_gpus_per_node * trainer.nnodes`` of a verl command line (verl's defaults 8 and 1)."""
    counts = []
    for key, default in (("trainer.n_gpus_per_node", VERL_GPUS_PER_NODE), ("trainer.nnodes", 1)):
        value = flat.get(key)
        try:
            counts.append(int(default if value is None else value))
        except (TypeError, ValueError):  # e.g. `trainer.n_gpus_per_node=` of a script whose variable is unset
            raise ConfigError(key, value, "is not a whole number (verl multiplies the per-GPU micro-batch sizes "
                              "by n_gpus_per_node x nnodes)", f"set {key}={default} or another count") from None
    return counts[0] * counts[1]


def ranks_of(flat: dict[str, Any], megatron_prefix: str, sp_key: str, gpus: int) -> int:
    """The ranks a global micro-batch is split over: the data-parallel ranks of Megatron
    (``gpus // (tp * pp * cp)``), else ``gpus // ulysses_size`` (verl's FSDP workers)."""
    from flowrl.catalog.backends import TRAIN_BACKENDS, ParallelAxis

    strategy = str(flat.get(f"{AR}.actor.strategy") or flat.get("critic.strategy") or "fsdp")
    # a strategy that splits the model over tensor/pipeline ranks (verl's megatron): only its
    # data-parallel ranks split the batch; verl's fsdp/fsdp2 split it over every GPU
    if strategy in TRAIN_BACKENDS.names() and TRAIN_BACKENDS.spec(strategy).supports(ParallelAxis.TP):
        split = 1
        for axis in ("tensor", "pipeline", "context"):
            split *= int(flat.get(f"{megatron_prefix}.megatron.{axis}_model_parallel_size")
                         or flat.get(f"{megatron_prefix}.megatron.{axis}_parallel_size") or 1)
        return max(gpus // split, 1)
    return max(gpus // int(flat.get(sp_key) or 1), 1)


def per_gpu_micro_batches(flat: dict[str, Any]) -> dict[str, int]:
    """flowrl's per-GPU micro-batch keys that ``flat`` (a verl command line, flat) sets through
    verl's global micro-batch keys; :class:`ConfigError` where verl would refuse them too."""
    out: dict[str, int] = {}
    gpus = num_gpus(flat)
    for key, (target, verl_per_gpu, sp_key, prefix, mini_key) in GLOBAL_MICRO_BATCHES.items():
        size = flat.get(key)
        if size is None:
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ConfigError(key, size, "must be a positive whole number of samples (or null)",
                              f"set {verl_per_gpu} instead (its per-GPU form)")
        if flat.get(verl_per_gpu) is not None:
            raise ConfigError(key, size, f"and {verl_per_gpu}={flat[verl_per_gpu]!r} are both set (verl refuses "
                              "it too: the global form is deprecated)", f"drop {key}")
        mini = flat.get(mini_key) if mini_key else None
        if isinstance(mini, int) and not isinstance(mini, bool) and mini % size:
            raise ConfigError(key, size, f"does not divide {mini_key}={mini} (verl refuses it too)",
                              f"choose a divisor of {mini}")
        ranks = ranks_of(flat, prefix, sp_key, gpus)
        if size < ranks:
            raise ConfigError(key, size, f"is smaller than the {ranks} GPUs it is split over "
                              f"(trainer.n_gpus_per_node * nnodes = {gpus}; verl refuses it too)",
                              f"set it to at least {ranks}, or {verl_per_gpu}")
        out[target] = size // ranks
    return out

"""Resource pools: which workers host which worker groups, checked against the run (pure; no Dask).

A pool is a set of Dask worker processes that carry the worker resource ``<pool name>: 1``
(given when the worker starts: a LocalCluster worker spec, or ``--resources`` in a SLURM job).
Each worker group is placed on the workers of its pool, one rank per worker process, and no
worker ever holds two ranks: the ranks of every collective group need their own process (Dask
actors share one thread per worker and each process has one default ``torch.distributed`` group,
so two ranks in one process would deadlock at the rendezvous).

- **auto** (the default): ``hybrid`` when the run allows it, else ``colocated``; resolved from
  the config alone, before any worker starts (:func:`resolve_placement`, which also says why).
- **colocated**: one pool, ``actor_rollout_ref``, hosts the rollout, actor and reference groups,
  each rank in a worker process of its own. Its workers are started together, from the same job
  template (same nodes, same GPUs per job when ``processes`` shares a job), and each group takes
  its own distinct workers of that pool.
- **hybrid** (verl's hybrid engine, ``ActorRolloutRefWorker``): one pool, ``actor_rollout_ref``,
  whose every worker process holds one rank of the rollout, actor and reference groups at once
  (one fused worker group, :data:`HYBRID_GROUP`, ``flowrl.roles.hybrid``); the three groups must
  have the same world size. Other groups (critic, reward model) get workers of their own there.
- **split**: one pool per group (``rollout``, ``actor``, ``ref``), or any user-declared grouping,
  e.g. ``[{name: train, groups: [actor, ref]}, {name: gen, groups: [rollout]}]``.

One more worker, the *controller*, carries the resource :data:`CONTROLLER` and runs the graph's
node tasks (see ``flowrl.actors.session``). Placing ranks on live workers is
``flowrl.cluster.pools``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from flowrl.catalog.backends import GEN_BACKENDS, TRAIN_BACKENDS, either
from flowrl.config.errors import ConfigError, check

#: Worker resource of the one worker that runs graph nodes (not a rank of any group).
CONTROLLER = "flowrl-controller"
#: The pool name of ``placement=colocated`` (as verl's role mapping calls it).
COLOCATED_POOL = "actor_rollout_ref"
#: ``placement=hybrid``: the groups whose ranks share one process, and the fused group's name.
HYBRID_GROUPS = ("rollout", "actor", "ref")
HYBRID_GROUP = "actor_rollout_ref"

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Pool:
    """A resolved pool: its name (the worker resource), its size and the groups it hosts."""

    name: str
    workers: int
    groups: tuple[str, ...]


def check_pool(pool: Any) -> None:
    """Checks of one ``PoolConfig`` on its own (its groups are checked against the run later)."""
    check(bool(pool.name) and bool(_NAME.match(pool.name)), "name", pool.name,
          "must be a name of letters, digits, _ . - (it becomes a Dask worker resource)", "use e.g. name=actor_rollout_ref")
    check(pool.name != CONTROLLER, "name", pool.name, "is reserved for the controller worker", "pick another pool name")
    check(len(pool.groups) > 0, "groups", pool.groups, "must name at least one worker group", "use e.g. groups=[actor, rollout, ref]")
    dupes = sorted({g for g in pool.groups if pool.groups.count(g) > 1})
    check(not dupes, "groups", pool.groups, f"names {dupes} twice", "list each group once")
    check(isinstance(pool.workers, int) and pool.workers >= 0, "workers", pool.workers, "must be an integer >= 0",
          "use 0 (the sum of its groups' world sizes) or a worker count")


def resolve_pools(cluster: Any, group_sizes: dict[str, int]) -> list[Pool]:
    """The pools a run needs: ``cluster.pools`` if declared, else one pool (colocated, hybrid) or
    one per group (split). ``placement=auto`` counts here as colocated, a pool for the groups as
    given (a run resolves auto first, :func:`resolve_placement`, and fuses the hybrid groups before
    it asks). Raises :class:`ConfigError` (key ``cluster.pools``) when a group has no pool, sits
    in two, or a pool is too small for its groups."""
    declared = list(getattr(cluster, "pools", []) or [])
    if not declared:
        placement = getattr(cluster, "placement", "colocated")
        if placement == "split":
            return [Pool(name, size, (name,)) for name, size in group_sizes.items()]
        # the hybrid groups share processes (the largest counts once), but only where there is a
        # rollout to fuse with the actor (flowrl.roles.specs.hybrid_specs): the supervised families'
        # actor and reference run side by side as in a colocated run
        if placement == "hybrid" and {"actor", "rollout"} <= set(group_sizes):
            fused = [size for name, size in group_sizes.items() if name in HYBRID_GROUPS]
            others = sum(size for name, size in group_sizes.items() if name not in HYBRID_GROUPS)
            return [Pool(COLOCATED_POOL, max(fused, default=0) + others, tuple(group_sizes))]
        return [Pool(COLOCATED_POOL, sum(group_sizes.values()), tuple(group_sizes))]
    pools = []
    seen: dict[str, str] = {}
    names = [p.name for p in declared]
    for i, p in enumerate(declared):
        key = f"cluster.pools[{i}]"
        if names.count(p.name) > 1:
            raise ConfigError(f"{key}.name", p.name, "is used by two pools", "give each pool its own name")
        for g in p.groups:
            if g not in group_sizes:
                raise ConfigError(f"{key}.groups", p.groups, f"names {g!r}, which this run does not start",
                                  "use the groups of this run: " + ", ".join(group_sizes))
            if g in seen:
                raise ConfigError(f"{key}.groups", p.groups, f"places {g!r}, already in pool {seen[g]!r}",
                                  "put each group in exactly one pool")
            seen[g] = p.name
        need = sum(group_sizes[g] for g in p.groups)
        if p.workers and p.workers < need:
            raise ConfigError(f"{key}.workers", p.workers,
                              f"is fewer than the {need} ranks of {', '.join(p.groups)} (one worker per rank)",
                              f"use workers={need} or 0 (automatic)")
        pools.append(Pool(p.name, p.workers or need, tuple(p.groups)))
    missing = [g for g in group_sizes if g not in seen]
    if missing:
        raise ConfigError("cluster.pools", [p.name for p in declared], f"places no pool for group(s) {missing}",
                          f"add {missing} to a pool's groups")
    return pools


def check_pools_cover(cluster: Any, group_sizes: dict[str, int]) -> None:
    """Validate the pools against the run's groups (called by ``RunConfig``; raises ConfigError)."""
    resolve_pools(cluster, group_sizes)


@dataclass(frozen=True)
class _HybridRule:
    """One thing ``placement=hybrid`` cannot do: the key and value that ask for it, why (the
    error's words), the fix, and the short reason ``placement=auto`` gives for colocated."""

    key: str
    value: Any
    problem: str
    fix: str
    auto_reason: str


def _hybrid_refusals(cfg: Any) -> list[_HybridRule]:
    """What in ``cfg`` keeps its rollout, actor and ref from sharing one process per rank, in the
    order an explicit ``cluster.placement=hybrid`` reports it (empty: hybrid can run it)."""
    out: list[_HybridRule] = []
    if cfg.cluster.pools:
        out.append(_HybridRule(
            "cluster.pools", [p.name for p in cfg.cluster.pools],
            "declares pools while cluster.placement=hybrid fuses rollout, actor and ref into one pool itself",
            "leave cluster.pools empty, or use cluster.placement=colocated", "cluster.pools are declared"))
    sizes = cfg.worker_group_sizes
    actor = sizes["actor"]
    for group, key in (("rollout", "rollout.data_parallel_size"), ("ref", "ref.data_parallel_size")):
        if group in sizes and sizes[group] != actor:
            out.append(_HybridRule(
                key, getattr(cfg, group).data_parallel_size,
                f"gives the {group} group {sizes[group]} ranks, the actor has {actor}; cluster.placement=hybrid "
                "puts one rank of each in every process",
                f"set {group} ranks to {actor} (data_parallel_size * tensor * pipeline sizes), "
                "or cluster.placement=colocated", f"the {group} group has {sizes[group]} ranks, the actor {actor}"))
    if cfg.trainer.staleness != 0:
        out.append(_HybridRule(
            "trainer.staleness", cfg.trainer.staleness,
            "generates ahead while the trainer trains, which cannot overlap in one process per rank "
            "(cluster.placement=hybrid)",
            "set cluster.placement=split (rollout on workers of its own), or trainer.staleness=0",
            f"trainer.staleness={cfg.trainer.staleness} generates while the trainer trains"))
    if "ref" in sizes and not TRAIN_BACKENDS.spec(cfg.actor.strategy).shares_process:
        out.append(_HybridRule(
            "actor.strategy", cfg.actor.strategy,
            "holds one model-parallel state per process, so the reference cannot share the actor's process "
            "(cluster.placement=hybrid)", "use cluster.placement=colocated, or no reference (actor.use_kl_loss=false, "
            "algorithm.use_kl_in_reward=false)",
            f"actor.strategy={cfg.actor.strategy} cannot share its process with a reference"))
    mode = getattr(cfg.trainer, "async_mode", "none")
    if mode != "none":
        out.append(_HybridRule(
            "trainer.async_mode", mode,
            "generates continuously while the trainer trains, which cannot overlap in one process per rank "
            "(cluster.placement=hybrid)", "set cluster.placement=split, or trainer.async_mode=none",
            f"trainer.async_mode={mode} generates while the trainer trains"))
    out += _generation_refusals(cfg)
    return out


def _generation_refusals(cfg: Any) -> list[_HybridRule]:
    """What the generation backend (its spec's ``in_process`` and ``joins_trainer_group``) keeps
    from running in the trainer's processes: an engine of its own that cannot join the trainer's
    group, or one that can but takes no LoRA adapters (``adapter_sync``) while the run trains them."""
    spec = GEN_BACKENDS.spec(cfg.rollout.name)
    hybrid_able = either(GEN_BACKENDS.names_where(lambda s: s.in_process or s.joins_trainer_group))
    if not (spec.in_process or spec.joins_trainer_group):
        return [_HybridRule(
            "rollout.name", cfg.rollout.name,
            "runs its engine in processes of its own with its own copy of the weights, so it cannot share the "
            f"trainer's process (cluster.placement=hybrid supports {hybrid_able})",
            "use cluster.placement=colocated with rollout.free_cache_engine=true (the engine sleeps while the trainer "
            f"runs), or rollout.name={hybrid_able}", f"rollout.name={cfg.rollout.name} runs its own engine")]
    if not spec.in_process and not spec.adapter_sync and cfg.model.lora_rank:
        return [_HybridRule(
            "model.lora_rank", cfg.model.lora_rank,
            f"with rollout.name={cfg.rollout.name} in the trainer's processes (cluster.placement=hybrid): this "
            "engine takes merged weights, not LoRA adapters, from the trainer's group",
            "use cluster.placement=colocated, or model.lora_rank=0",
            f"LoRA adapters with rollout.name={cfg.rollout.name} sync to an engine of its own")]
    return []


def resolve_placement(cfg: Any) -> tuple[str, str]:
    """``(placement, why)`` of a ``RunConfig``: ``cluster.placement`` itself when set explicitly
    (why: ``""``); ``auto`` gives ``("hybrid", "auto")`` when an explicit hybrid would be accepted
    (:func:`check_placement`), else ``("colocated", "auto: <what hybrid cannot do>; ...")``.
    Pure: the config alone decides, before any worker starts."""
    placement = cfg.cluster.placement
    if placement != "auto":
        return placement, ""
    refusals = _hybrid_refusals(cfg)
    if refusals:
        return "colocated", "auto: " + "; ".join(r.auto_reason for r in refusals)
    return "hybrid", "auto"


def check_placement(cfg: Any) -> None:
    """The pools against a ``RunConfig``'s groups (:func:`check_pools_cover`), then an explicit
    ``cluster.placement=hybrid`` against the rest (called by it; raises ConfigError naming the
    key and the fix): one process per rank holds the rollout, actor and reference, so their
    world sizes agree, nothing overlaps generation with training, the generation engine lives in
    the process (not vLLM's own), and pools are not declared. ``auto`` never refuses: where
    hybrid would be refused it resolves to colocated (:func:`resolve_placement`)."""
    check_pools_cover(cfg.cluster, cfg.worker_group_sizes)
    if cfg.cluster.placement != "hybrid":
        return
    refusals = _hybrid_refusals(cfg)
    if refusals:
        r = refusals[0]
        raise ConfigError(r.key, r.value, r.problem, r.fix)

"""Weight nodes: the weight sync (training shards -> generation ranks; in one process per rank
with the hybrid engine) and, colocated, the rollout engine's release of its memory until that sync."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flowrl.actors.group import BoundCall, WorkerGroup, wait_all
from flowrl.metrics import names
from flowrl.nodes.core import NodeOut, node

if TYPE_CHECKING:
    from flowrl.backends.reshard import ReshardJob

log = logging.getLogger(__name__)


def same_ranks(actor: WorkerGroup, rollout: WorkerGroup) -> bool:
    """Whether the two groups are views of one fused group (``cluster.placement=hybrid``): the
    same worker processes, one rank of each in every process."""
    return list(actor.addresses) == list(rollout.addresses)


def reshard(actor: BoundCall, rollout: BoundCall, _after: Any, job: "ReshardJob", fingerprint: str = "off") -> NodeOut:
    """Training shards -> generation ranks (``flowrl.backends.reshard``): every rank of both groups
    runs its part of ``job`` at once, over the groups' joint gloo group (joined on first use).
    Views of one hybrid group run it once per process, in the fused role (``reshard`` on the
    actor's turn, ``reshard_done`` on the rollout's).

    ``fingerprint`` (``trainer.checks.weight_sync``: ``off``, ``warn``, ``error``): every rank
    also fingerprints the parameter slices it holds after the sync (the trainer's what it sent,
    the generation's what its engine holds, :mod:`flowrl.checks.fingerprint`) and this node
    compares them (:func:`verify_fingerprints`): a mismatch fails the sync naming the parameter
    and ranks (``error``) or is logged (``warn``)."""
    timeout = max(actor.group.timeout_s, rollout.group.timeout_s)
    kwargs = {"fingerprint": True} if fingerprint != "off" else {}
    if same_ranks(actor.group, rollout.group):
        futures = [a.call(actor.seq, "reshard", (job,), kwargs, timeout) for a in actor.group.actors]
        futures += [a.call(rollout.seq, "reshard_done", (), {}, timeout) for a in rollout.group.actors]
        results = wait_all(futures, timeout, f"{actor.group.name}+{rollout.group.name}.reshard",
                           list(actor.group.addresses) * 2)[:actor.group.world_size]
        checked = verify_fingerprints([r for r, _ in results], fingerprint)
        return NodeOut(None, {**reshard_metrics([r for r, _ in results], max(s for _, s in results)), **checked})
    if getattr(job, "joint", None) is not None and not job.joint.host:  # rendezvous at the actor's rank 0
        host, port = actor.group.actors[0].host_port().result(timeout=timeout)
        job = dataclasses.replace(job, joint=dataclasses.replace(job.joint, host=host, port=port))
    futures, addresses = [], []
    for bound in (actor, rollout):
        futures += [a.call(bound.seq, bound.group.method("reshard"), (job,), kwargs, timeout) for a in bound.group.actors]
        addresses += bound.group.addresses
    results = wait_all(futures, timeout, f"{actor.group.name}+{rollout.group.name}.reshard", addresses)
    checked = verify_fingerprints([r for r, _ in results], fingerprint)
    return NodeOut(None, {**reshard_metrics([r for r, _ in results], max(s for _, s in results)), **checked})


def verify_fingerprints(per_process: list[dict], mode: str) -> dict[str, float]:
    """Compare the fingerprint reports the ranks attached (popped from their statistics):
    ``reshard/fingerprint_params`` (parameters compared), ``reshard/fingerprint_mismatch`` (how
    many differ), ``reshard/fingerprint_s`` (the slowest rank's fingerprint time), and for the
    ``engine_moved`` check the engine's probe log-prob and the trainer's total fingerprint
    (``reshard/probe_logp``, ``reshard/fingerprint_src``). A mismatch
    raises :class:`~flowrl.checks.fingerprint.WeightSyncMismatch` in ``error`` mode (naming the
    parameter and the ranks), is logged in ``warn`` mode."""
    probes = [p for p in (stats.pop("probe_logp", None) for stats in per_process) if p is not None]
    reports = [r for stats in per_process for r in (stats.pop("fingerprint", None) or [])]
    if mode == "off" or not reports:
        return {}
    from flowrl.checks.fingerprint import WeightSyncMismatch, compare, mismatch_message, trainer_total
    from flowrl.checks.sync import PROBE, TRAINER

    mismatches, compared = compare(reports)
    if mismatches and mode == "error":
        raise WeightSyncMismatch(mismatch_message(mismatches, compared))
    if mismatches:
        log.warning("%s", mismatch_message(mismatches, compared))
    total = trainer_total(reports)
    probe = {PROBE: probes[0], TRAINER: total} if probes and total is not None else {}  # checks.engine_moved
    return {names.RESHARD_PREFIX + "fingerprint_params": float(compared),
            names.RESHARD_PREFIX + "fingerprint_mismatch": float(len(mismatches)),
            names.RESHARD_PREFIX + "fingerprint_s": max(r["seconds"] for r in reports), **probe}


def reshard_metrics(per_process: list[dict], seconds: float) -> dict[str, float]:
    """``reshard/bytes`` (received over the network, all processes), ``reshard/bytes_min`` (the
    plan's theoretical minimum, summed from each process's own), ``reshard/peak_extra_bytes``
    (the largest staging peak of any process) and ``compute_s/reshard`` (the slowest process);
    ``perf/`` statistics a process reports (a hybrid rank's hand-over seconds and phase memory
    peaks, ``flowrl.backends.reshard.engine_load``, ``flowrl.roles.hybrid.PhaseMemory``): the
    largest of any process."""
    perf = {k for s in per_process for k in s if k.startswith("perf/")}
    return {
        names.RESHARD_BYTES: float(sum(s["bytes_received"] for s in per_process)),
        names.RESHARD_BYTES_MIN: float(sum(s["bytes_min"] for s in per_process)),
        names.RESHARD_PEAK_EXTRA_BYTES: float(max(s["peak_extra_bytes"] for s in per_process)),
        names.compute(names.RESHARD): seconds,
        **wire_metrics(per_process),
        **{k: float(max(s.get(k, 0.0) for s in per_process)) for k in sorted(perf)},
    }


def wire_metrics(per_process: list[dict]) -> dict[str, float]:
    """``reshard/wire_device``: the share of the processes that moved their messages as device
    tensors on NCCL (``flowrl.backends.reshard.wire_plan``: 1.0 on a GPU hybrid group, 0.0 on the
    host wire); ``reshard/wire_batched``: the share whose rounds were batched (``device`` or a
    ``batched`` wire asked for). Absent when no process ran the transport (shared weights,
    adapters, an in-process load)."""
    wires = [s["wire"] for s in per_process if "wire" in s]
    if not wires:
        return {}
    return {names.RESHARD_PREFIX + "wire_device": sum(w == "device" for w in wires) / len(wires),
            names.RESHARD_PREFIX + "wire_batched": sum(w != "host" for w in wires) / len(wires)}


def build_reshard(cfg: Any, actor: WorkerGroup, rollout: WorkerGroup, after: Any, *, step: int) -> Any:
    """The ``reshard`` node of a run (actor group -> rollout group), ordered after ``after``.

    Binds the actor's and then the rollout's next call now, so the rollout's next ``gen`` runs
    after this reshard has written the new weights. The job (``job_for_run``) is derived in the
    node, where ``model.path`` is readable.

    Views of one hybrid group whose ranks generate with the training parameters themselves
    (``WorkerGroup.shares_weights``) have nothing to sync: the node calls no rank (the rollout's
    next call follows the update in the group's one call order) and reports the same metrics as
    a sync that moved nothing (``reshard/bytes`` 0)."""
    if same_ranks(actor, rollout) and actor.shares_weights:
        return node(names.RESHARD, _shared_weights, after, cfg, actor.world_size, step=step)
    return node(names.RESHARD, _reshard_run, actor.bind(), rollout.bind(), after, cfg, step=step)


def _shared_weights(after: Any, cfg: Any, world_size: int) -> NodeOut:
    from flowrl.backends.reshard import job_for_run

    job = job_for_run(cfg, colocated=True)
    per_process = [{"bytes_received": 0, "bytes_min": job.min_bytes(r), "peak_extra_bytes": 0} for r in range(world_size)]
    return NodeOut(None, reshard_metrics(per_process, 0.0))


def _reshard_run(actor: BoundCall, rollout: BoundCall, after: Any, cfg: Any) -> NodeOut:
    from flowrl.backends.reshard import job_for_run
    from flowrl.backends.reshard.job import with_devices

    job = job_for_run(cfg, colocated=same_ranks(actor.group, rollout.group))
    # the processes' GPUs from the device plan: with the group's backend they choose the wire
    job = with_devices(job, actor.group.devices, rollout.group.devices)
    job = _nccl_job(cfg, actor.group, rollout.group, job)
    return reshard(actor, rollout, after, job, fingerprint=cfg.trainer.checks.weight_sync)


_NCCL_ENDPOINTS: dict[tuple, tuple] = {}
"""Per (trainer ranks' addresses, senders): the NCCL rendezvous the first sync reserved; the
groups are made once, so later syncs name the same."""


def _nccl_job(cfg: Any, actor: WorkerGroup, rollout: WorkerGroup, job: Any) -> Any:
    """``job`` as a sync over vLLM's NCCL weight transfer where
    :func:`~flowrl.backends.generate.vllm_nccl.choose_weight_path` picks it (split pools of
    GPUs, vLLM, no LoRA), else ``job`` as is."""
    from flowrl.backends.generate.vllm_nccl import choose_weight_path, nccl_sync_job, sender_ranks
    from flowrl.backends.reshard import ReshardJob
    from flowrl.config.pools import resolve_placement

    placement = "hybrid" if same_ranks(actor, rollout) else resolve_placement(cfg)[0]
    path = choose_weight_path(placement=placement, trainer_devices=actor.devices, engine_devices=rollout.devices,
                              engine=cfg.rollout.name, lora=not isinstance(job, ReshardJob))
    if path.name != "nccl":
        return job
    tp = cfg.rollout.tensor_model_parallel_size
    senders = sender_ranks(actor.world_size, rollout.world_size // tp)
    key = (tuple(actor.addresses), senders)
    if key not in _NCCL_ENDPOINTS:
        _NCCL_ENDPOINTS[key] = tuple(tuple(actor.actors[s].host_port().result(timeout=actor.timeout_s))
                                     for s in senders)
    log.info("weight sync over vLLM's NCCL weight transfer: %s", path.reason)
    return nccl_sync_job(job, engine_tp=tp, endpoints=_NCCL_ENDPOINTS[key], model_dir=cfg.model.path)


def release_rollout(rollout: BoundCall, table: pa.Table) -> NodeOut:
    """Colocated mode: every rollout rank releases its KV cache and parks its weights (vLLM sleep)
    until the next weight sync; passes ``table`` through so what follows runs after it."""
    _, seconds = rollout.run("sleep")
    return NodeOut(table, {names.compute("rollout_sleep"): seconds})

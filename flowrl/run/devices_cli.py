"""``flowrl devices [CONFIG.yaml] [key=value ...] [--gpus-per-node N] [--nodes M]``: the run's
device plan as a table (group, rank, node, GPUs, local rank, backend, dtype), without a GPU and
without starting anything. The inventory: ``--gpus-per-node``/``--nodes`` when given; else the SLURM
jobs of ``cluster.slurm`` (``cluster.kind=slurm``); else what this machine shows (``FLOWRL_DEVICES``
overrides: ``flowrl.cluster.inventory``). The groups are those ``flowrl train`` starts: with the hybrid
placement, the one fused ``actor_rollout_ref`` group. With ``model.path`` and a known GPU memory
(``cluster.gpu_memory_gb``, or ``nvidia-smi``), the actor's and the critic's rank memory estimates follow, and a
layout that cannot fit is refused as ``flowrl train`` refuses it (``flowrl.run.memory_check``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["format_plan", "run"]


def _inventory(cfg: Any, args: argparse.Namespace) -> Any:
    """``--gpus-per-node``/``--nodes`` when given (the other from the run's inventory), else what
    ``flowrl train`` plans on (``flowrl.cluster.inventory.run_inventory``: FLOWRL_DEVICES, the
    SLURM jobs, or this machine's GPUs counted without initialising CUDA)."""
    from flowrl.cluster.inventory import run_inventory
    from flowrl.parallel.device_plan import Inventory

    if args.gpus_per_node is not None or args.nodes is not None:
        base = run_inventory(cfg) if args.gpus_per_node is None else None
        return Inventory(nodes=args.nodes if args.nodes is not None else 1,
                         gpus_per_node=args.gpus_per_node if base is None else base.gpus_per_node,
                         source="--gpus-per-node/--nodes")
    return run_inventory(cfg)


def format_plan(plan: Any) -> str:
    header = ("group", "rank", "node", "GPUs", "local rank", "backend", "dtype")
    rows = [header, *[tuple(str(c) for c in row) for row in plan.rows()]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    used = len(plan.gpus_used())
    foot = f"inventory: {plan.inventory.describe()}; GPUs used: {used}" if plan.inventory.has_gpus else \
        f"inventory: {plan.inventory.describe()}; every rank on the CPU"
    return "\n".join([*lines, foot])


def run(args: argparse.Namespace) -> int:
    from flowrl.config import ConfigError
    from flowrl.config.devices import check_slurm_jobs, device_plan
    from flowrl.config.loader import load_config
    from flowrl.parallel.device_plan import DevicePlanError
    from flowrl.run.memory_check import check_trainer_memory

    path = args.items[0] if args.items and "=" not in args.items[0] else None
    cfg = load_config(path, args.items[1:] if path else args.items)
    try:
        inventory = _inventory(cfg, args)
    except DevicePlanError as exc:
        raise ConfigError(f"--{exc.key.replace('_', '-')}", exc.value, exc.problem, exc.fix) from None
    plan = device_plan(cfg, inventory)
    check_slurm_jobs(cfg, plan)  # the SLURM jobs must hold the plan's nodes, as flowrl train checks
    memory = check_trainer_memory(cfg, plan)  # each trainer rank fits its GPU, as flowrl train checks
    print(format_plan(plan))
    for section, est in memory.items():
        print(f"{section} rank memory: about {est.describe()} of {est.limit_gb:.1f} GB usable per GPU")
    sys.stdout.flush()
    return 0

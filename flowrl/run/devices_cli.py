"""``flowrl devices [CONFIG.yaml] [key=value ...] [--gpus-per-node N] [--nodes M]``: the run's
device plan as a table (group, rank, node, GPUs, local rank, backend, dtype), without a GPU and
without starting anything. The inventory: ``--gpus-per-node``/``--nodes`` when given; else the SLURM
jobs of ``cluster.slurm`` (``cluster.kind=slurm``); else what this machine shows."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["format_plan", "local_inventory", "run"]


def local_inventory() -> Any:
    """This machine's GPUs (``torch.cuda.device_count()``, which reads the driver without making
    a CUDA context; 0 where torch has no CUDA)."""
    from flowrl.parallel.device_plan import Inventory

    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken CUDA install counts as none
        count = 0
    return Inventory(nodes=1, gpus_per_node=count, source="this machine")


def _inventory(cfg: Any, args: argparse.Namespace) -> Any:
    from flowrl.config.devices import slurm_inventory
    from flowrl.parallel.device_plan import Inventory

    if args.gpus_per_node is not None or args.nodes is not None:
        base = slurm_inventory(cfg) if cfg.cluster.kind == "slurm" else local_inventory()
        return Inventory(nodes=args.nodes if args.nodes is not None else 1,
                         gpus_per_node=args.gpus_per_node if args.gpus_per_node is not None else base.gpus_per_node,
                         source="--gpus-per-node/--nodes")
    return slurm_inventory(cfg) if cfg.cluster.kind == "slurm" else local_inventory()


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
    from flowrl.config.devices import device_plan
    from flowrl.config.loader import load_config
    from flowrl.parallel.device_plan import DevicePlanError

    path = args.items[0] if args.items and "=" not in args.items[0] else None
    cfg = load_config(path, args.items[1:] if path else args.items)
    try:
        inventory = _inventory(cfg, args)
    except DevicePlanError as exc:
        raise ConfigError(f"--{exc.key.replace('_', '-')}", exc.value, exc.problem, exc.fix) from None
    print(format_plan(device_plan(cfg, inventory)))
    sys.stdout.flush()
    return 0

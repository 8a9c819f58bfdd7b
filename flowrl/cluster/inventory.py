"""The devices a run may use, asked of the world before any worker starts (the I/O the pure device
plan, ``flowrl.parallel.device_plan``, keeps out).

* ``cluster.kind=local``: what the driver sees, *without* initialising CUDA in the driver (a CUDA
  context in the driver would be inherited by forked workers, and it pins the driver to a GPU the
  ranks need): ``CUDA_VISIBLE_DEVICES`` when set (the workers inherit it, and each rank's plan
  index is read through it), else the lines of ``nvidia-smi -L``, else none.
* ``cluster.kind=slurm``: what the jobs of ``cluster.slurm`` get (``gpus_per_job`` per job, one
  node per job; ``flowrl.config.devices.slurm_inventory``); the driver may sit on a login node
  without GPUs, so nothing local is asked.
* ``cluster.kind=address``: the CPU. The driver cannot see an existing scheduler's workers before
  it connects, so GPUs there are declared with :data:`DEVICES_ENV`.

:data:`DEVICES_ENV` overrides all three, as verl's ``trainer.n_gpus_per_node`` / ``nnodes`` and
``CUDA_VISIBLE_DEVICES`` do there.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any, Callable, Mapping

from flowrl.parallel.device_plan import Inventory

__all__ = ["DEVICES_ENV", "local_inventory", "parse_devices", "run_inventory", "visible_gpu_count"]

DEVICES_ENV = "FLOWRL_DEVICES"
"""What the run's ranks run on, read by the driver before any worker starts:

* unset, empty or ``auto``: the cluster's own (local: this machine's GPUs; SLURM:
  ``cluster.slurm.gpus_per_job``; address: the CPU);
* ``cpu``: every rank a CPU process on gloo in fp32, on a machine with GPUs too (as
  ``CUDA_VISIBLE_DEVICES=`` does for the local cluster);
* ``G`` or ``GxN``: ``G`` GPUs per node on ``N`` nodes (default 1): what an ``address`` cluster's
  workers have (ranks go to the workers of the plan's node, by host), or a smaller share of a
  local machine's GPUs.

Example: ``FLOWRL_DEVICES=cpu flowrl train ...`` trains on the CPU of a GPU machine."""

NVIDIA_SMI_TIMEOUT_S = 20.0
"""How long ``nvidia-smi -L`` may take (a hung driver must not hang ``flowrl train``)."""

Runner = Callable[[list[str]], str]
"""Runs a command and returns its standard output; raises when the command fails or is missing."""

_SPEC = re.compile(r"^\s*(\d+)\s*(?:x\s*(\d+)\s*)?$")


def _run(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True).stdout


def visible_gpu_count(environ: Mapping[str, str] | None = None, runner: Runner | None = None) -> int:
    """The GPUs this process would see, without initialising CUDA: the entries of
    ``CUDA_VISIBLE_DEVICES`` when set (up to the first invalid one, as CUDA reads it: ``""``,
    ``-1`` or SLURM's ``NoDevFiles`` mean none), else the ``GPU n:`` lines of ``nvidia-smi -L``,
    else 0 (no ``nvidia-smi``, or it failed)."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for entry in visible.split(","):
            entry = entry.strip()
            if not entry or entry == "NoDevFiles" or (entry.lstrip("-").isdigit() and int(entry) < 0):
                break
            count += 1
        return count
    try:
        out = (runner or _run)(["nvidia-smi", "-L"])
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def local_inventory(environ: Mapping[str, str] | None = None, runner: Runner | None = None) -> Inventory:
    """This machine as one node with :func:`visible_gpu_count` GPUs."""
    return Inventory(nodes=1, gpus_per_node=visible_gpu_count(environ, runner), source="this machine")


def parse_devices(value: str) -> Inventory | None:
    """:data:`DEVICES_ENV`'s value as an inventory, or None for ``auto`` (the cluster's own).
    Raises ``ConfigError`` naming the variable and the forms it takes."""
    from flowrl.config.errors import ConfigError

    value = value.strip().lower()
    if value in ("", "auto"):
        return None
    if value == "cpu":
        return Inventory(nodes=1, gpus_per_node=0, source=f"{DEVICES_ENV}=cpu")
    match = _SPEC.match(value)
    if not match or int(match.group(1)) < 1 or (match.group(2) is not None and int(match.group(2)) < 1):
        raise ConfigError(DEVICES_ENV, value, "is not a device inventory",
                          "use cpu, auto, G (G GPUs on one node) or GxN (G GPUs on each of N nodes), e.g. 8x2")
    gpus, nodes = int(match.group(1)), int(match.group(2) or 1)
    return Inventory(nodes=nodes, gpus_per_node=gpus, source=f"{DEVICES_ENV}={value}")


def machine_inventory(environ: Mapping[str, str] | None = None, runner: Runner | None = None) -> Inventory:
    """This machine's inventory as a LocalCluster started here sees it: :data:`DEVICES_ENV` when
    it says, else :func:`local_inventory`."""
    environ = os.environ if environ is None else environ
    return parse_devices(environ.get(DEVICES_ENV, "")) or local_inventory(environ, runner)


def run_inventory(cfg: Any, *, environ: Mapping[str, str] | None = None, runner: Runner | None = None) -> Inventory:
    """The inventory a run of ``cfg`` plans on (see the module docstring): :data:`DEVICES_ENV`
    when it says, else by ``cluster.kind``."""
    environ = os.environ if environ is None else environ
    declared = parse_devices(environ.get(DEVICES_ENV, ""))
    if declared is not None:
        return declared
    kind = cfg.cluster.kind
    if kind == "slurm":
        from flowrl.config.devices import slurm_inventory

        return slurm_inventory(cfg)
    if kind == "address":
        return Inventory(nodes=1, gpus_per_node=0,
                         source=f"cluster.kind=address: the CPU unless {DEVICES_ENV} declares its workers' GPUs")
    return local_inventory(environ, runner)

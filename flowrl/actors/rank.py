"""The thin Dask actor that holds one rank of a worker group.

One ``RankActor`` lives in each worker process (never two collective-joining actors on one
worker). It owns a role object (a policy, a reference, a rollout engine), built inside the actor
by import string so the class is importable on any worker. Calls carry a per-group sequence
number: the actor runs them strictly in that order, whatever order they arrive in, so every rank
of a group sees the same order and collectives cannot interleave. Work runs on one dedicated
thread (torch's thread-local state stays put); the coroutine that waits for its turn keeps the
worker's event loop free, so heartbeats continue during long steps.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from flowrl.comm import close_all, rendezvous_store, reserve_port
from flowrl.registry import import_string


def _resolve(role: Any, method: str) -> Any:
    """``role.<method>``; a dotted name (``rollout.generate``) walks the role's parts (a hybrid
    rank's role holds several: ``flowrl.roles.hybrid``)."""
    target = role
    for name in method.split("."):
        target = getattr(target, name)
    return target


def _torch_modules() -> tuple[Any, Any]:
    """``(torch, torch.distributed)``, imported when a rank sets up (tests replace them)."""
    import torch
    import torch.distributed as dist

    return torch, dist


class OutOfOrderTimeout(TimeoutError):
    """A call waited longer than its timeout for an earlier call of the group."""


class RankClosing(RuntimeError):
    """A call still waiting for its turn when the group was shut down."""


class RankActor:
    """One rank of a worker group. Created with ``client.submit(RankActor, ..., actor=True)``."""

    def __init__(self, group: str, rank: int, world_size: int) -> None:
        self.group, self.rank, self.world_size = group, rank, world_size
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{group}-{rank}")
        self._next_seq = 0
        self._turn: asyncio.Condition | None = None
        self._closing = False  # set by shutdown: calls still waiting for their turn give up
        self.role: Any = None

    # ----------------------------------------------------------------- ordered execution
    async def call(self, seq: int, method: str, args: tuple = (), kwargs: dict | None = None, timeout: float = 600.0) -> Any:
        """Run ``role.<method>(*args, **kwargs)`` (or ``self.<method>`` for ``_``-prefixed
        built-ins) once every call with a smaller sequence number has finished.

        Returns ``(result, seconds)`` where seconds is the wall time of the work itself.
        """
        if self._turn is None:
            self._turn = asyncio.Condition()
        deadline = time.monotonic() + timeout
        async with self._turn:
            while self._next_seq != seq:
                if self._closing:
                    raise RankClosing(f"{self.group}[{self.rank}]: call {seq} ({method}) dropped: the group is shutting down")
                if seq < self._next_seq:
                    raise RuntimeError(f"{self.group}[{self.rank}]: call {seq} ({method}) arrived after {self._next_seq - 1}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OutOfOrderTimeout(
                        f"{self.group}[{self.rank}]: call {seq} ({method}) waited {timeout:.0f}s for call {self._next_seq}"
                    )
                try:
                    await asyncio.wait_for(self._turn.wait(), remaining)
                except asyncio.TimeoutError:
                    continue
        target = getattr(self, method) if method.startswith("_") else _resolve(self.role, method)
        loop = asyncio.get_running_loop()
        try:
            start = time.perf_counter()
            result = await loop.run_in_executor(self._executor, lambda: target(*args, **(kwargs or {})))
            return result, time.perf_counter() - start
        finally:
            async with self._turn:
                self._next_seq = seq + 1
                self._turn.notify_all()
            if method == "_teardown":
                self._executor.shutdown(wait=False, cancel_futures=True)

    async def shutdown(self, timeout: float) -> bool:
        """Unordered: tear down now, without waiting for calls the graph reserved but never
        made (a failed or interrupted step leaves such gaps in the sequence). Calls waiting for
        their turn give up; the teardown runs on the work thread after the call running there,
        if any. Returns False when that call (e.g. a collective with a dead peer) does not end
        within ``timeout``: the process then goes with its worker, torn down or not."""
        self._closing = True
        if self._turn is not None:
            async with self._turn:
                self._turn.notify_all()
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._executor, self._teardown)
        try:
            await asyncio.wait_for(asyncio.shield(work), timeout)
        except asyncio.TimeoutError:
            return False
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)
        return True

    def ping(self) -> tuple[str, int, int]:
        """Unordered: (group, rank, pid). For health checks."""
        return self.group, self.rank, os.getpid()

    def host_port(self) -> tuple[str, int]:
        """Unordered: an address peers can reach this process at, and a port there that stays
        reserved for the rendezvous store this process will serve."""
        from distributed import get_worker

        host = get_worker().address.split("://")[-1].rsplit(":", 1)[0]
        return host, reserve_port(host)

    # ----------------------------------------------------------------- built-in ordered calls
    def _setup(self, master: tuple[str, int], role_cls: str, role_kwargs: dict, backend: str, timeout_s: float,
               placement: dict | None = None) -> dict:
        """Place this rank on its device (``placement``: its part of the run's device plan,
        ``flowrl.actors.device``; None on CPU), join the group's ``torch.distributed`` process
        group, then build the role. The placement comes first: ``CUDA_VISIBLE_DEVICES`` counts
        only until CUDA initialises, and NCCL binds a communicator to the current device."""
        torch, dist = _torch_modules()
        from flowrl.actors.device import apply_placement

        device = apply_placement(placement or {}, torch=torch)
        torch.set_num_threads(1)
        host, port = master
        if host.startswith("127.") or host == "localhost":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep gloo off external interfaces
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = host, str(port)
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(self.rank), str(self.world_size)
        extra = {}
        if device != "cpu" and "device_id" in inspect.signature(dist.init_process_group).parameters:
            extra["device_id"] = torch.device(device)  # NCCL's communicator made now, on this rank's GPU
        dist.init_process_group(
            backend=backend,
            store=rendezvous_store(host, port, self.rank, self.world_size, timedelta(seconds=timeout_s)),
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
            **extra,
        )
        cls = import_string(role_cls)
        self.role = cls(rank=self.rank, world_size=self.world_size, **role_kwargs)
        # a hybrid rank whose generation runs on the training parameters (flowrl.roles.hybrid)
        return {"pid": os.getpid(), "backend": backend, "shares_weights": bool(getattr(self.role, "shared", False)),
                "device": device}

    def _teardown(self) -> None:
        import torch.distributed as dist

        close = getattr(self.role, "close", None)
        if close is not None:
            close()
        self.role = None
        close_all()  # joint process groups (flowrl.comm.joint)
        if dist.is_initialized():
            dist.destroy_process_group()
        # Interpreter shutdown with torch loaded spends seconds in the final garbage collection
        # (measured: the nanny's 4 s kill timeout ran out); collect now, then exempt what is left.
        import gc

        gc.collect()
        gc.freeze()

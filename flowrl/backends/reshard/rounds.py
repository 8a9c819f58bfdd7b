"""Round transports: how one round of a reshard's messages is posted on a process group.

``exchange.execute_schedule`` builds each message's buffer (the tensor slice itself, or a staging
buffer it packs) and hands it to a transport, then waits for what the transport returns:

- :class:`HostRounds` (the ``host`` wire): every buffer is in host memory (``wire.check_wire``)
  and is posted at once on its own, ``recv``/``send`` with the round's tag, messages in the
  schedule's order. Exactly the path the transport always took.
- :class:`BatchedRounds` (the ``device`` and ``batched`` wires, ``wire_plan``): buffers live on
  the wire's device (CUDA over NCCL; host memory over gloo), the round's messages are taken in
  ``wire_plan.round_order`` (both ends derive it from their own plan) and posted as one
  ``torch.distributed.batch_isend_irecv`` when the round is flushed; tags unused. A group that
  torch.distributed does not know (``flowrl.comm.joint``'s gloo group, test fakes) cannot take a
  ``P2POp``: its ops are posted one by one in the same order with tag 0, which is what
  ``batch_isend_irecv`` itself does on a backend without coalescing (gloo).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from flowrl.backends.reshard import wire as _wire
from flowrl.backends.reshard.wire import HOST
from flowrl.backends.reshard.wire_plan import WireChoice, round_order

__all__ = ["BatchedRounds", "HostRounds", "group_backend", "make_rounds"]


class HostRounds:
    """The ``host`` wire: each buffer posted as soon as it is built, with its tag."""

    name = "host"
    device = HOST

    def __init__(self, pg: Any) -> None:
        self.pg = pg
        self._works: list[Any] = []

    def order(self, messages: Iterable[Any], process: int) -> list[tuple[str, Any]]:
        """This process's part of a round in the schedule's own message order."""
        out = []
        for m in messages:
            if m.dst_process == process:
                out.append(("recv", m))
            elif m.src_process == process:
                out.append(("send", m))
        return out

    def as_is(self, view: torch.Tensor, dtype: torch.dtype) -> bool:
        """Whether ``view`` may go on the wire itself: one contiguous slice of the wire dtype in
        host memory (else it is staged in host memory)."""
        return _wire.on_host(view) and view.is_contiguous() and view.dtype == dtype

    def post(self, kind: str, buf: torch.Tensor, peer: int, tag: int) -> None:
        what = "receive" if kind == "recv" else "send"
        op = self.pg.recv if kind == "recv" else self.pg.send
        self._works.append(op([_wire.check_wire(buf, what)], peer, tag))

    def flush(self) -> list[Any]:
        """The works of the ops posted since the last flush."""
        works, self._works = self._works, []
        return works


class BatchedRounds:
    """The ``device`` / ``batched`` wires: a round's ops posted as one batch at :meth:`flush`."""

    def __init__(self, pg: Any, *, name: str, device: torch.device) -> None:
        self.pg, self.name, self.device = pg, name, device
        self._ops: list[tuple[str, torch.Tensor, int]] = []

    def order(self, messages: Iterable[Any], process: int) -> list[tuple[str, Any]]:
        return round_order(messages, process)

    def as_is(self, view: torch.Tensor, dtype: torch.dtype) -> bool:
        on = _wire.on_host(view) if self.device == HOST else view.device == self.device
        return on and view.is_contiguous() and view.dtype == dtype

    def post(self, kind: str, buf: torch.Tensor, peer: int, tag: int) -> None:  # noqa: ARG002 - tags unused
        if self.device == HOST:
            _wire.check_wire(buf, "receive" if kind == "recv" else "send")
        elif buf.device != self.device:
            raise RuntimeError(f"reshard: a {kind} buffer on {buf.device} reached the {self.name} wire on "
                               f"{self.device}")
        self._ops.append((kind, buf, peer))

    def flush(self) -> list[Any]:
        ops, self._ops = self._ops, []
        if not ops:
            return []
        import torch.distributed as dist

        if _registered(self.pg):
            return dist.batch_isend_irecv([
                dist.P2POp(dist.irecv if kind == "recv" else dist.isend, buf, group=self.pg, group_peer=peer)
                for kind, buf, peer in ops])
        return [(self.pg.recv if kind == "recv" else self.pg.send)([buf], peer, 0) for kind, buf, peer in ops]


def _registered(pg: Any) -> bool:
    """Whether torch.distributed knows ``pg`` (the world group, ``new_group``'s), so it takes
    ``P2POp`` s."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return False
    try:
        dist.get_backend(pg)
    except (ValueError, RuntimeError, TypeError, AttributeError):
        return False
    return True


def group_backend(pg: Any) -> str | None:
    """``pg``'s backend string (``"cpu:gloo,cuda:nccl"``, ``"gloo"``, ...); None when it has no
    name (test fakes without a ``backend`` attribute)."""
    if _registered(pg):
        import torch.distributed as dist

        return str(dist.get_backend(pg))
    name = getattr(pg, "name", None)
    if callable(name):
        try:
            return str(name())
        except (RuntimeError, TypeError):
            return None
    return getattr(pg, "backend", None)


def make_rounds(choice: WireChoice, pg: Any) -> HostRounds | BatchedRounds:
    """The transport of ``choice`` over ``pg``; the ``device`` wire's buffers on the current CUDA
    device (each rank sees its own GPU as ``cuda:0``, ``flowrl.actors.device``)."""
    if not choice.batched:
        return HostRounds(pg)
    device = torch.device("cuda", torch.cuda.current_device()) if choice.on_device else HOST
    return BatchedRounds(pg, name=choice.name, device=device)

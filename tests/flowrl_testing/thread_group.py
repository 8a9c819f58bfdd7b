"""An in-process stand-in of a gloo process group for reshard transports run as threads of one
process (``tests/unit/test_reshard_devices.py``, ``test_reshard_wire.py``)."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

__all__ = ["ThreadGroup"]

_LOCK = threading.Lock()


class _Work:
    def __init__(self, done: Callable[[], Any] | None = None) -> None:
        self._done = done

    def wait(self) -> None:
        if self._done is not None:
            self._done()


class ThreadGroup:
    """``send``/``recv`` between threads: a send completes at once (a copy queued per (src, dst,
    tag)), a receive's ``wait`` takes the oldest (within ``timeout_s``); gloo moves bytes, so the
    two ends' shapes may differ, their element counts not. Every post is kept in ``posted`` as
    ``(op, peer, tag, tensor)``; ``backend``: what the group reports (None: not asked)."""

    def __init__(self, rank: int, boxes: dict, backend: str | None = None, *, timeout_s: float = 60.0) -> None:
        self.rank, self.boxes, self.posted, self.backend, self.timeout_s = rank, boxes, [], backend, timeout_s

    def _box(self, key: tuple) -> queue.Queue:
        with _LOCK:
            return self.boxes.setdefault(key, queue.Queue())

    def send(self, tensors: list, dst: int, tag: int) -> _Work:
        self.posted.append(("send", dst, tag, tensors[0]))
        self._box((self.rank, dst, tag)).put(tensors[0].clone())  # the bytes leave now
        return _Work()

    def recv(self, tensors: list, src: int, tag: int) -> _Work:
        self.posted.append(("recv", src, tag, tensors[0]))
        box = self._box((src, self.rank, tag))
        return _Work(lambda: tensors[0].view(-1).copy_(box.get(timeout=self.timeout_s).view(-1)))

"""torch.distributed rendezvous: free ports and the TCPStore a process group meets on."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

__all__ = ["free_port", "rendezvous_store", "reserve_port"]

_RESERVED: dict[tuple[str, int], socket.socket] = {}  # bound, not yet listening: the store takes it


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it; a later bind may still race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def reserve_port(host: str) -> int:
    """A port on ``host`` that stays bound in this process until :func:`rendezvous_store` (rank
    0, same host and port) listens on it: no other process can take it in between (a port
    chosen by :func:`free_port` and bound later lost that race on a busy machine)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    _RESERVED[(host, port)] = sock
    return port


def rendezvous_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta) -> Any:
    """The group's TCPStore. Rank 0 serves it on ``host`` only (the group's interface:
    127.0.0.1 for local workers): torch's own server listens on every interface (``::``), which
    would expose the rendezvous beyond it. The store has no authentication (see README)."""
    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(host, port, world_size=world_size, is_master=False, timeout=timeout)
    sock = _RESERVED.pop((host, port), None)
    if sock is None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    sock.listen(128)
    return dist.TCPStore(host, port, world_size=world_size, is_master=True, timeout=timeout,
                         wait_for_workers=False, master_listen_fd=sock.detach())

"""torch.distributed rendezvous: free ports and the store a process group meets on.

A store has no authentication: whoever reaches it reads and writes the group's keys (the
addresses its ranks connect to). So when the group's ranks share this machine (the rendezvous
host is the loopback) and the run named a private directory (``FLOWRL_PRIVATE_DIR``, 0700:
``flowrl.cluster.private``), the store is a ``FileStore`` in it: only this user can open it and
nothing listens. Its file is named by the port rank 0 reserved (:func:`reserve_port`): that socket
stays bound, never listening, while the group lives, so no other group of the machine gets the
same name. Otherwise (ranks on several machines) it is a TCPStore on the group's interface only.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

__all__ = ["free_port", "release_port", "rendezvous_store", "reserve_port"]

_RESERVED: dict[tuple[str, int], socket.socket] = {}  # bound, not yet listening: the store takes it
_HELD: list[socket.socket] = []  # bound, never listening: the names of this process's FileStores


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
    directory = _private_dir(host)
    if directory is not None:  # a file left by a group of this name that died: not this group's
        import os

        try:
            os.unlink(store_path(directory, port))
        except FileNotFoundError:
            pass
    return port


def release_port(host: str, port: int) -> None:
    """Give up this process's reservation of ``port`` (:func:`reserve_port`) for a server that
    binds it itself (vLLM's weight-transfer rendezvous: ``vllm_nccl.open_endpoint``); another
    process may take the port between this and that bind. Nothing if it is not reserved here."""
    sock = _RESERVED.pop((host, port), None)
    if sock is not None:
        sock.close()


def _private_dir(host: str) -> str | None:
    """The run's private directory when the rendezvous can be a FileStore there, else None."""
    import os

    path = os.environ.get("FLOWRL_PRIVATE_DIR")
    if not path or not (host.startswith("127.") or host in ("localhost", "::1")):
        return None
    st = os.lstat(path) if os.path.isdir(path) else None
    if st is None or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None  # not a private directory of ours: use no file in it
    return path


def store_path(directory: str, port: int) -> str:
    """The FileStore of the group whose rank 0 reserved ``port``."""
    import os

    return os.path.join(directory, f"rendezvous-{port}")


def rendezvous_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta) -> Any:
    """The group's store: a FileStore in the run's private directory when all ranks are on this
    machine (see the module docstring), else the TCPStore below.

    The TCPStore. Rank 0 serves it on ``host`` only (the group's interface:
    127.0.0.1 for local workers): torch's own server listens on every interface (``::``), which
    would expose the rendezvous beyond it. The store has no authentication (see README)."""
    import torch.distributed as dist

    directory = _private_dir(host)
    if directory is not None:
        store = dist.FileStore(store_path(directory, port), world_size)
        store.set_timeout(timeout)
        if rank == 0 and (host, port) in _RESERVED:
            _HELD.append(_RESERVED.pop((host, port)))  # keeps the name unique while the group lives
        return store
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

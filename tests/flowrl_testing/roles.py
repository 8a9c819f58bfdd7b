"""Small roles used by the tests and examples of worker groups (importable on every worker)."""

from __future__ import annotations

import os
import time


class EchoRole:
    """Records the order of calls; all-reduces to prove the group is a real process group."""

    def __init__(self, *, rank: int, world_size: int, tag: str = "") -> None:
        self.rank, self.world_size, self.tag = rank, world_size, tag
        self.log: list[str] = []

    def record(self, item: str, delay: float = 0.0) -> list[str]:
        time.sleep(delay)
        self.log.append(item)
        return list(self.log)

    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value + self.rank], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def rows(self, table):  # noqa: ANN001 - pyarrow table
        import pyarrow as pa

        return table.append_column("rank", pa.array([self.rank] * table.num_rows, type=pa.int32()))

    def pid(self) -> int:
        return os.getpid()

    def fail(self) -> None:
        raise ValueError(f"rank {self.rank} failed on purpose")

    def exit_process(self) -> None:
        os._exit(1)

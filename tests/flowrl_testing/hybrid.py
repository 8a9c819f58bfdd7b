"""The colocated ("hybrid engine") role: the trained policy and a generation engine in one process.

Each rank of one worker group holds its training shard (``PolicyRole``, any strategy and layout)
and a generation engine (``RolloutRole``); ``reshard(job)`` moves the trainer's weights into the
generation engines of the whole group in place, with local slicing where a rank already holds
what its generation shard needs and point-to-point within the group's own process group for the
rest (``job.placement`` is colocated: ``flowrl.parallel.reshard_plan.micro_dp_placement``).
Given a split job, the group is the sending side, as a ``PolicyRole`` group is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flowrl.roles.policy import PolicyRole
from flowrl.roles.rollout import RolloutRole

if TYPE_CHECKING:
    from flowrl.backends.reshard import ReshardJob


class HybridRole:
    def __init__(self, *, rank: int, world_size: int, policy: dict[str, Any], rollout: dict[str, Any]) -> None:
        self.rank = rank
        self.policy = PolicyRole(rank=rank, world_size=world_size, **policy)
        self.rollout = RolloutRole(rank=rank, world_size=world_size, **rollout)

    def compute_logprobs(self, table: pa.Table, column: str = "old_logprobs") -> pa.Table:
        """The trainer's log-probs (``PolicyRole.compute_logprobs``)."""
        return self.policy.compute_logprobs(table, column)

    def gen_logprobs(self, table: pa.Table, column: str = "gen_logprobs") -> pa.Table:
        """The generation engine's teacher-forced log-probs of the same rows."""
        return self.rollout.compute_logprobs(table, column)

    def hf_state_dict(self) -> dict | None:
        """The trainer's full HF-named state on rank 0 (every rank must call it)."""
        return self.policy.hf_state_dict()

    def gen_state_dict(self) -> dict:
        """This rank's generation weights by HF name."""
        return self.rollout.hf_state_dict()

    def generate(self, prompts: pa.Table, seed: int = 0) -> pa.Table:
        return self.rollout.generate(prompts, seed=seed)

    def update(self, table: pa.Table, mini_batch_rows: int) -> dict[str, float]:
        return self.policy.update(table, mini_batch_rows)

    def reshard(self, job: "ReshardJob") -> dict:
        """Colocated job: trainer shards -> this group's generation engines (this rank is process
        ``rank``). Split job: this group is the source side (``PolicyRole.reshard``)."""
        from flowrl.backends.reshard import run_rank

        placement = job.placement
        if placement.kind != "colocated":
            return self.policy.reshard(job)
        return run_rank(
            job,
            src_rank=placement.src.index(self.rank) if self.rank in placement.src else None,
            dst_rank=placement.dst.index(self.rank) if self.rank in placement.dst else None,
            src=self.policy.engine.reshard_source(),
            dst=self.rollout.engine.reshard_target(),
        )

    def close(self) -> None:
        self.policy.close()

"""The frozen reference policy: log-probs of the sampled responses."""

from __future__ import annotations

import pyarrow as pa

from flowrl.catalog.backends import TRAIN_BACKENDS
from flowrl.data import experience
from flowrl.data.packed import PackedBatch
from flowrl.parallel.dtypes import resolve_dtype
from flowrl.roles.memory import Residency


class ReferenceRole:
    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        model_dir: str,
        strategy: str = "dp",
        dtype: str = "float32",
        device: str = "cpu",
        micro_batch_size: int = 256,
        temperature: float = 1.0,
        max_token_len: int = 0,
        prefix_grouper: bool = False,
        engine_kwargs: dict | None = None,
    ) -> None:
        self.rank = rank
        engine_cls = TRAIN_BACKENDS.spec(strategy).engine_class()
        self.engine = engine_cls(model_dir, trainable=False, dtype=resolve_dtype(dtype, device), device=device,
                                 **(engine_kwargs or {}))
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature
        self.max_token_len = max_token_len  # > 0: micro-batches by tokens, packed (log_prob_use_dynamic_bsz)
        self.prefix_grouper = prefix_grouper  # each group's prompt once (ref.use_prefix_grouper)
        # ref.megatron.param_offload: the weights on the device only for its forward (an fsdp
        # reference's param_offload is FSDP2's CPUOffloadPolicy instead: its engine moves nothing here)
        self.residency = Residency(self.engine)
        self.residency.release()

    def compute_logprobs(self, table: pa.Table, column: str = "ref_logprobs") -> pa.Table:
        """A one-column table: ``column`` for each row of ``table``."""
        batch = PackedBatch.from_table(table).with_token_budget(self.max_token_len).with_shared_prompts(self.prefix_grouper)
        with self.residency.resident():
            logp_T, _ = self.engine.forward_logprobs(batch, micro_batch_size=self.micro_batch_size,
                                                     temperature=self.temperature)
        array = experience.list_column(logp_T, batch.response_cu_B1, experience.TOKEN_FLOATS)
        return pa.table({column: array})

    def close(self) -> None:
        self.engine.close()

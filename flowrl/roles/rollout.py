"""Generation: expand each prompt into ``n`` sampled responses, as experience rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowrl.backends.interfaces import SamplingParams
from flowrl.backends.registry import GEN_BACKENDS
from flowrl.data import experience

if TYPE_CHECKING:
    from flowrl.backends.reshard import ReshardJob


class RolloutRole:
    """One rank of the generation mesh. With ``tensor_model_parallel_size`` tp > 1 (``vllm``),
    each replica's tp rank 0 holds one engine spanning tp devices and the other tp ranks hold
    none: they take part in weight syncs only (``reshard``)."""

    def __init__(self, *, rank: int, world_size: int, model_dir: str, backend: str = "hf", dtype: str = "float32", micro_batch_size: int = 256, sampling: SamplingParams, tensor_model_parallel_size: int = 1, engine_kwargs: dict | None = None) -> None:
        self.rank = rank
        self.tp = tensor_model_parallel_size
        self.dtype = dtype
        self.holds_engine = rank % self.tp == 0
        self.staged_reshard = GEN_BACKENDS.traits(backend)["reshard"] == "staged"
        self.engine = GEN_BACKENDS.get(backend)(model_dir, dtype=dtype, **(engine_kwargs or {})) if self.holds_engine else None
        self.sampling = sampling
        self.micro_batch_size = micro_batch_size

    def generate(self, prompts: pa.Table, seed: int = 0, sampling: SamplingParams | None = None) -> pa.Table:
        """One row per sample: the prompt's columns repeated ``n`` times, plus ``uid``,
        ``response_ids``, ``response_mask`` and ``rollout_logprobs``."""
        params = sampling or self.sampling
        if self.engine is None:
            return None  # not an output rank: the replica's engine rank answers for it
        prompt_ids = prompts.column("prompt_ids").to_pylist()
        responses, logprobs = self.engine.generate(
            prompt_ids, params, seed=seed * 1009 + self.rank, micro_batch_size=self.micro_batch_size
        )
        repeat = np.repeat(np.arange(prompts.num_rows), params.n)
        table = prompts.take(pa.array(repeat))
        sample = np.tile(np.arange(params.n), prompts.num_rows)
        uid = pc.binary_join_element_wise(
            pc.cast(table.column("group"), pa.string()), pa.array(sample.astype(str)), "-"
        )
        mask = [[1] * len(r) for r in responses]
        return experience.with_columns(
            table,
            uid=uid,
            response_ids=experience.from_lists(responses, experience.TOKEN_IDS),
            response_mask=experience.from_lists(mask, pa.list_(pa.int8())),
            rollout_logprobs=experience.from_lists(logprobs, experience.TOKEN_FLOATS),
        )

    def load_hf_state(self, state: dict) -> None:
        if self.engine is not None:
            self.engine.load_hf_state(state)

    def sleep(self) -> None:
        """Colocated mode: release the engine's KV cache and park its weights while the trainer
        runs (``rollout.free_cache_engine``); the next weight load or generation restores them.
        Engines without such a mode do nothing."""
        if self.engine is not None:
            self.engine.sleep()

    def wake_up(self) -> None:
        if self.engine is not None:
            self.engine.wake_up()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.engine = None

    def compute_logprobs(self, table: pa.Table, column: str = "gen_logprobs", temperature: float | None = None) -> pa.Table:
        """Teacher-forced log-probs of the table's responses under this engine's weights."""
        t = self.sampling.temperature if temperature is None else temperature
        logps = self.engine.logprobs(
            table.column("prompt_ids").to_pylist(), table.column("response_ids").to_pylist(), temperature=t or 1.0
        )
        return pa.table({column: experience.from_lists(logps, experience.TOKEN_FLOATS)})

    def hf_state_dict(self) -> dict:
        """A copy of the engine's current weights by HF name (for checks)."""
        return {k: v.clone() for k, v in self.engine.reshard_target().items()}

    def reshard(self, job: "ReshardJob") -> dict:
        """Receive this rank's generation tensors from the trainer (``flowrl.backends.reshard``)."""
        from flowrl.backends.reshard import run_rank

        if not self.staged_reshard:  # written in place (backend trait reshard="in_place")
            return run_rank(job, dst_rank=self.rank, dst=self.engine.reshard_target())
        # Engines that cannot be written in place (vllm): stage the shard, assemble full HF
        # tensors on the replica's engine rank, load them through the engine's update path.
        from flowrl.backends.generate.staging import gather_replica_state, staging_tensors
        from flowrl.backends.interfaces import torch_dtype

        spec = job.plan().dst
        staged = staging_tensors(spec, self.rank, torch_dtype(self.dtype))
        stats = run_rank(job, dst_rank=self.rank, dst=staged)
        state = gather_replica_state(spec, self.rank, self.tp, staged)
        if state is not None:
            self.engine.load_hf_state(state)
        return stats

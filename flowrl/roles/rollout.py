"""Generation: expand each prompt into ``n`` sampled responses, as experience rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowrl.backends.generate import GEN_BACKENDS
from flowrl.backends.generate.hf import SamplingParams
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
        Engines without such a mode ignore it."""
        if self.engine is not None and hasattr(self.engine, "sleep"):
            self.engine.sleep()

    def wake_up(self) -> None:
        if self.engine is not None and hasattr(self.engine, "wake_up"):
            self.engine.wake_up()

    def close(self) -> None:
        if self.engine is not None and hasattr(self.engine, "close"):
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

        if self.engine is not None and hasattr(self.engine, "reshard_target"):
            return run_rank(job, dst_rank=self.rank, dst=self.engine.reshard_target())
        # Engines that cannot be written in place (vllm): stage the shard, assemble full HF
        # tensors on the replica's engine rank, load them through the engine's update path.
        from flowrl.backends.generate.staging import _DTYPES, gather_replica_state, staging_tensors

        spec = job.plan().dst
        staged = staging_tensors(spec, self.rank, _DTYPES[self.dtype])
        stats = run_rank(job, dst_rank=self.rank, dst=staged)
        state = gather_replica_state(spec, self.rank, self.tp, staged)
        if state is not None:
            self.engine.load_hf_state(state)
        return stats


def rollout_role_kwargs(rollout: Any, *, max_prompt_length: int, seed: int) -> dict:
    """The role's backend-specific keyword arguments for a ``RolloutConfig``."""
    if rollout.name != "vllm":
        return {}
    return {
        "tensor_model_parallel_size": rollout.tensor_model_parallel_size,
        "engine_kwargs": {
            "tensor_parallel_size": rollout.tensor_model_parallel_size,
            "gpu_memory_utilization": rollout.gpu_memory_utilization,
            "free_cache_engine": rollout.free_cache_engine,
            "enforce_eager": rollout.enforce_eager,
            "max_num_seqs": rollout.micro_batch_size,
            "max_model_len": max_prompt_length + rollout.response_length,
            "seed": seed,
        },
    }


def check_rollout_backend(rollout: Any) -> None:
    """Before any worker starts: the chosen backend is installed and usable here."""
    if rollout.name != "vllm":
        return
    from flowrl.backends.generate.vllm import INSTALL_HINT, vllm_problem
    from flowrl.config.errors import ConfigError

    problem = vllm_problem()
    if problem is not None:
        raise ConfigError("rollout.name", rollout.name, problem, f"install vLLM ({INSTALL_HINT}), or use rollout.name=hf")

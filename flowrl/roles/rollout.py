"""Generation: expand each prompt into ``n`` sampled responses, as experience rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowrl.backends.generate import GEN_BACKENDS
from flowrl.backends.generate.hf import SamplingParams
from flowrl.data import experience


class RolloutRole:
    def __init__(self, *, rank: int, world_size: int, model_dir: str, backend: str = "hf", dtype: str = "float32", micro_batch_size: int = 256, sampling: SamplingParams) -> None:
        self.rank = rank
        self.engine = GEN_BACKENDS.get(backend)(model_dir, dtype=dtype)
        self.sampling = sampling
        self.micro_batch_size = micro_batch_size

    def generate(self, prompts: pa.Table, seed: int = 0, sampling: SamplingParams | None = None) -> pa.Table:
        """One row per sample: the prompt's columns repeated ``n`` times, plus ``uid``,
        ``response_ids``, ``response_mask`` and ``rollout_logprobs``."""
        params = sampling or self.sampling
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
        self.engine.load_hf_state(state)

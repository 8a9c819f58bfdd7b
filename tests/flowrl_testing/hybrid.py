"""Test helpers around the hybrid engine (``flowrl.roles.hybrid``).

- :class:`HybridRole`: the library's role under the interface ``tests/dist/test_reshard.py``
  drives (``policy=`` / ``rollout=`` keyword arguments, flat method names), so that test runs the
  real role's colocated reshard (megatron shards -> full HF models in the same processes).
- :func:`measure_memory`: one process's memory for a placement (``train``: the trainer alone;
  ``hybrid``: trainer and generation in one role; ``rollout``: a generation engine alone, the
  second process of today's colocated placement), after real generation and update steps on
  the same rows. Run in a fresh process each (``python -m flowrl_testing.hybrid KIND MODEL``)
  so that peak RSS belongs to that placement only.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flowrl.roles import hybrid as lib

if TYPE_CHECKING:
    from flowrl.backends.reshard import ReshardJob

POLICY = "flowrl.roles.policy:PolicyRole"
ROLLOUT = "flowrl.roles.rollout:RolloutRole"


class HybridRole(lib.HybridRole):
    def __init__(self, *, rank: int, world_size: int, policy: dict[str, Any], rollout: dict[str, Any]) -> None:
        super().__init__(rank=rank, world_size=world_size, parts={"actor": (POLICY, policy), "rollout": (ROLLOUT, rollout)})

    def compute_logprobs(self, table: pa.Table, column: str = "old_logprobs") -> pa.Table:
        """The trainer's log-probs (``PolicyRole.compute_logprobs``)."""
        return self.actor.compute_logprobs(table, column)

    def gen_logprobs(self, table: pa.Table, column: str = "gen_logprobs") -> pa.Table:
        """The generation engine's teacher-forced log-probs of the same rows."""
        return self.rollout.compute_logprobs(table, column)

    def hf_state_dict(self) -> dict | None:
        return self.actor.hf_state_dict()

    def gen_state_dict(self) -> dict:
        return self.rollout.hf_state_dict()

    def generate(self, prompts: pa.Table, seed: int = 0) -> pa.Table:
        return self.rollout.generate(prompts, seed=seed)

    def update(self, table: pa.Table, mini_batch_rows: int) -> dict[str, float]:
        return self.actor.update(table, mini_batch_rows)

    def reshard(self, job: "ReshardJob") -> dict:
        return super().reshard(job)


# --------------------------------------------------------------------------- memory
def role_parts(model_dir: str, *, n: int = 8, response_length: int = 16, micro_batch_size: int = 64) -> dict:
    """The actor (dp, fp32 AdamW) and rollout (hf) parts of a one-rank hybrid role on ``model_dir``."""
    from flowrl.backends.interfaces import SamplingParams
    from flowrl.config import ActorConfig

    actor = ActorConfig(data_parallel_size=1, use_kl_loss=False, ppo_micro_batch_size_per_gpu=micro_batch_size)
    policy = {"model_dir": model_dir, "actor": actor, "use_old_logprobs": False, "response_length": response_length}
    rollout = {"model_dir": model_dir, "micro_batch_size": micro_batch_size,
               "sampling": SamplingParams(n=n, temperature=1.0, max_new_tokens=response_length)}
    return {"actor": (POLICY, policy), "rollout": (ROLLOUT, rollout)}


def prompt_table(num_prompts: int, vocab: int, *, seed: int = 0) -> pa.Table:
    """``num_prompts`` random prompts of 5-9 tokens (ids 3 .. vocab-1), one group each."""
    import random

    from flowrl.data import experience

    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randrange(5, 10))] for _ in range(num_prompts)]
    return pa.table({"prompt_ids": experience.from_lists(prompts, experience.TOKEN_IDS),
                     "group": pa.array(range(num_prompts), pa.int64())})


def _train_table(samples: pa.Table) -> pa.Table:
    """Samples with advantages (+1 / -1 alternating per row) for an update step."""
    import numpy as np

    from flowrl.data import experience

    lengths = [len(r) for r in samples.column("response_ids").to_pylist()]
    adv = [[float(1 - 2 * (i % 2))] * n for i, n in enumerate(lengths)]
    return experience.with_columns(samples, advantages=experience.from_lists(adv, experience.TOKEN_FLOATS),
                                   response_mask=experience.from_lists([list(np.ones(n, int)) for n in lengths],
                                                                       pa.list_(pa.int8())))


def measure_memory(kind: str, model_dir: str, *, steps: int = 2, num_prompts: int = 8, n: int = 8) -> dict:
    """Memory of one process holding placement ``kind`` (``train``, ``hybrid`` or ``rollout``)
    after ``steps`` generate-then-update steps: RSS above the process's RSS after imports
    (``rss_peak_delta``, from ``getrusage``), and tensor bytes by kind (``role_memory_bytes``)."""
    import importlib

    import torch
    import transformers

    from flowrl.roles.memory import peak_rss_bytes, role_memory_bytes, rss_bytes
    from flowrl.roles.policy import PolicyRole
    from flowrl.roles.rollout import RolloutRole

    config = transformers.AutoConfig.from_pretrained(model_dir)  # the model's code, before the baseline
    importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    torch.set_num_threads(1)
    base = rss_bytes()
    parts = role_parts(model_dir, n=n)
    policy = rollout = None
    if kind == "hybrid":
        role = lib.HybridRole(rank=0, world_size=1, parts=parts)
        policy, rollout = role.actor.inner, role.rollout.inner
    if kind == "train":
        policy = PolicyRole(rank=0, world_size=1, **parts["actor"][1])
    if kind == "rollout":
        rollout = RolloutRole(rank=0, world_size=1, **parts["rollout"][1])
    vocab = (policy or rollout).engine.model.config.vocab_size
    generator = rollout or _Generator(policy, n)
    for step in range(steps):
        samples = generator.generate(prompt_table(num_prompts, vocab, seed=step), seed=step)
        if policy is not None:
            policy.update(_train_table(samples), samples.num_rows)
    tensors = role_memory_bytes(policy, rollout)
    return {"kind": kind, "rss_base": base, "rss_peak": peak_rss_bytes(), "rss_peak_delta": peak_rss_bytes() - base,
            "tensors": tensors,
            "tensor_total": sum(tensors.values())}


class _Generator:
    """Samples for the trainer alone (``train``: no generation engine in the process): random
    responses of 1-16 tokens, as long as the generated ones may be."""

    def __init__(self, policy: Any, n: int) -> None:
        from flowrl.backends.interfaces import SamplingParams
        from flowrl.data import experience

        self.policy, self.n, self.experience, self.params = policy, n, experience, SamplingParams(n=n, max_new_tokens=16)

    def generate(self, prompts: pa.Table, seed: int = 0) -> pa.Table:
        import random

        rng = random.Random(seed)
        vocab = self.policy.engine.model.config.vocab_size
        table = prompts.take(pa.array([i for i in range(prompts.num_rows) for _ in range(self.n)]))
        responses = [[rng.randrange(3, vocab) for _ in range(rng.randrange(1, 17))] for _ in range(table.num_rows)]
        return self.experience.with_columns(table, response_ids=self.experience.from_lists(responses,
                                                                                           self.experience.TOKEN_IDS))


if __name__ == "__main__":
    print(json.dumps(measure_memory(sys.argv[1], sys.argv[2])))

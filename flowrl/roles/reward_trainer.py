"""The reward model being trained (the ``rm`` family): Bradley-Terry on preference pairs with a
scalar head on the causal LM (``flowrl.backends.train.dp_reward``), on the ``actor`` group so the
run's checkpoints, resume and ``export-hf`` treat it as the trained model; the exported directory
is a sequence-classification model, usable as ``reward_model.model_path`` in RL.

Settings are the actor's (``actor.strategy``, ``actor.optim``, mini- and micro-batch sizes in
pairs), as for the other supervised families.
"""

from __future__ import annotations

import pyarrow as pa

from flowrl.algos.rm_loss import RM_LOSS
from flowrl.backends.train.reward import reward_engine_class
from flowrl.backends.train.optim import AdamWSettings, ScheduledRate
from flowrl.catalog.backends import TRAIN_BACKENDS
from flowrl.config import ActorConfig
from flowrl.data.packed import PackedBatch
from flowrl.metrics import names
from flowrl.parallel.dtypes import resolve_dtype
from flowrl.registry import import_string
from flowrl.roles import checkpoints
from flowrl.roles.epochs import run_epochs
from flowrl.roles.supervised import micro_batch_rows, reduced_step


class RewardTrainerRole:
    def __init__(self, *, rank: int, world_size: int, model_dir: str, actor: ActorConfig, dtype: str = "float32",
                 device: str = "cpu", seed: int = 0, total_steps: int = 0) -> None:
        self.rank, self.world_size = rank, world_size
        self.cfg = actor
        spec = TRAIN_BACKENDS.spec(actor.strategy)
        self.checkpoint_kind = spec.checkpoint
        engine_kwargs = import_string(spec.engine_kwargs)(actor) if spec.engine_kwargs else {}
        self.engine = reward_engine_class(actor.strategy)(
            model_dir, dtype=resolve_dtype(dtype, device), device=device, seed=seed,
            **AdamWSettings.from_config(actor.optim).engine_kwargs(), **engine_kwargs)
        self.rate = ScheduledRate(actor.optim, total_steps)

    # ----------------------------------------------------------------- nodes
    def train_pairs(self, table: pa.Table, mini_batch_rows: int) -> dict[str, float]:
        """``actor.ppo_epochs`` passes over this rank's pairs, one optimizer step per
        ``mini_batch_rows`` rows (whole pairs); ``actor/rm_loss``, ``actor/accuracy``, ..."""
        batch = PackedBatch.from_table(table)
        self.rate.before_update(self.engine.optimizer)

        def step(mini: PackedBatch) -> dict[str, float]:
            return reduced_step(self.engine, RM_LOSS, mini, lambda loss_fn: self.engine.train_step_values(
                mini, micro_batch_size=micro_batch_rows(self.cfg, RM_LOSS), loss_fn=loss_fn), {})

        return run_epochs(batch, epochs=self.cfg.ppo_epochs, mini_batch_rows=mini_batch_rows, step=step, prefix=names.ACTOR)

    def compute_rm_scores(self, table: pa.Table) -> pa.Table:
        """A one-column table: ``rm_score`` of each row (as ``RewardModelRole.compute_rm_scores``)."""
        batch = PackedBatch.from_table(table)
        scores_B = self.engine.forward_values(batch, micro_batch_size=micro_batch_rows(self.cfg, RM_LOSS))
        return pa.table({"rm_score": pa.array(scores_B.numpy(), pa.float32())})

    # ----------------------------------------------------------------- weights
    def hf_state_dict(self):  # noqa: ANN201 - dict of tensors, or None on sharded ranks
        return self.engine.hf_state_dict()

    def save_checkpoint(self, path: str, *, step: int, extra: dict) -> dict | None:
        return checkpoints.save(self.engine, self.checkpoint_kind, path, rank=self.rank, step=step, extra=extra)

    def load_checkpoint(self, path: str) -> int:
        self.rate.resume(path)
        return checkpoints.load(self.engine, self.checkpoint_kind, path)

    def save_hf(self, directory: str) -> None:
        """A sequence-classification directory (``reward_model.model_path``); sharded: every rank."""
        from flowrl.catalog.backends import CheckpointKind

        if self.rank == 0 or self.checkpoint_kind is CheckpointKind.SHARDED:
            self.engine.save_hf(directory)

    def close(self) -> None:
        self.engine.close()

"""The reward model being trained (the ``rm`` family): Bradley-Terry on preference pairs with a
scalar head on the causal LM (``flowrl.backends.train.dp_reward``), on the ``actor`` group so the
run's checkpoints, resume and ``export-hf`` treat it as the trained model; the exported directory
is a sequence-classification model, usable as ``reward_model.model_path`` in RL.

Settings are the actor's (``actor.strategy``, ``actor.optim``, mini- and micro-batch sizes in
pairs), as for the other supervised families. With LoRA (``model.lora_rank`` > 0, dp and fsdp)
adapters train on the backbone and the head trains whole; checkpoints hold both, ``extra["lora"]``
their settings (``flowrl export-hf --merge-lora`` writes the merged sequence classifier).
"""

from __future__ import annotations

import pyarrow as pa

from flowrl.algos.rm_loss import RM_LOSS
from flowrl.backends.train.reward import reward_engine_class, reward_engine_kwargs
from flowrl.backends.train.optim import AdamWSettings, ScheduledRate
from flowrl.catalog.backends import TRAIN_BACKENDS, CheckpointKind
from flowrl.config import ActorConfig
from flowrl.data.packed import PackedBatch
from flowrl.metrics import names
from flowrl.parallel.dtypes import resolve_dtype
from flowrl.roles import checkpoints
from flowrl.roles.epochs import run_epochs
from flowrl.roles.supervised import micro_batch_rows, reduced_step


class RewardTrainerRole:
    def __init__(self, *, rank: int, world_size: int, model_dir: str, actor: ActorConfig, dtype: str = "float32",
                 device: str = "cpu", seed: int = 0, total_steps: int = 0, lora: dict | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.cfg = actor
        self.checkpoint_kind = TRAIN_BACKENDS.spec(actor.strategy).checkpoint
        engine_kwargs = {**reward_engine_kwargs(actor), **({"lora": lora} if lora else {})}
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

    def _lora(self) -> dict | None:
        lora = getattr(self.engine, "lora", None)
        return lora.to_dict() if lora is not None else None

    def save_checkpoint(self, path: str, *, step: int, extra: dict) -> dict | None:
        """As the policy's: with LoRA the adapters and the head, ``extra["lora"]`` their settings."""
        lora = self._lora()
        extra = {**extra, "lora": lora} if lora is not None else extra
        return checkpoints.save(self.engine, self.checkpoint_kind, path, rank=self.rank, step=step, extra=extra)

    def load_checkpoint(self, path: str) -> int:
        """ValueError when the checkpoint's LoRA settings (or their absence) differ from this run's."""
        from flowrl.checkpoint import load_meta

        saved, mine = (load_meta(path).get("extra") or {}).get("lora"), self._lora()
        if saved != mine:
            raise ValueError(f"checkpoint {path} holds LoRA adapters {saved} (None: every weight), this run "
                             f"model.lora_rank/lora_alpha/target_modules={mine}; fix: resume with the "
                             "checkpoint's model.lora_* settings, or start a fresh run (trainer.resume_mode=disable)")
        self.rate.resume(path)
        return checkpoints.load(self.engine, self.checkpoint_kind, path)

    def resume_state(self) -> dict:
        """Every rank: its part of a checkpoint's resume record (``trainer.checks.resume``,
        :func:`flowrl.checks.resume.engine_state`), as the policy role's."""
        from flowrl.checks.resume import engine_state

        return engine_state(self.engine, self.rank, sharded=self.checkpoint_kind is CheckpointKind.SHARDED)

    def save_hf(self, directory: str) -> None:
        """A sequence-classification directory (``reward_model.model_path``); sharded: every rank."""
        from flowrl.catalog.backends import CheckpointKind

        if self.rank == 0 or self.checkpoint_kind is CheckpointKind.SHARDED:
            self.engine.save_hf(directory)

    def close(self) -> None:
        self.engine.close()

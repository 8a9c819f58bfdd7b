"""The PPO critic: values of the sampled responses, and the clipped value-loss update.

Holds a value model (a ``VALUE_BACKENDS`` engine chosen by ``critic.strategy``: the policy's model
family with a one-output head) and its own optimizer. Like ``PolicyRole``, denominators are global
(summed over data-parallel ranks), so each mini-batch's gradient equals the single-process one.
"""

from __future__ import annotations

import pyarrow as pa
import torch

from flowrl.algos import agg_denominator
from flowrl.algos.actor_loss import critic_loss
from flowrl.backends.train.optim import AdamWSettings, ScheduledRate
from flowrl.backends.train.ulysses_options import sequence_parallel_kwargs
from flowrl.catalog.backends import VALUE_BACKENDS
from flowrl.config import CriticConfig
from flowrl.config.batching_auto import settled
from flowrl.data import experience
from flowrl.data.packed import PackedBatch
from flowrl.metrics import names
from flowrl.parallel.dtypes import resolve_dtype
from flowrl.registry import import_string
from flowrl.roles import checkpoints
from flowrl.roles.epochs import run_epochs
from flowrl.roles.memory import Residency


class CriticRole:
    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        model_dir: str,
        critic: CriticConfig,
        dtype: str = "float32",
        device: str = "cpu",
        response_length: int = 1,
        seed: int = 0,
        total_steps: int = 0,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.cfg = settled(critic)  # as resolved by the run (roles.specs), else auto off
        self.response_length = response_length
        o = critic.optim
        spec = VALUE_BACKENDS.spec(critic.strategy)
        self.checkpoint_kind = spec.checkpoint
        engine_kwargs = import_string(spec.engine_kwargs)(critic) if spec.engine_kwargs else {}
        engine_kwargs.update(sequence_parallel_kwargs(critic))  # Ulysses (flowrl.backends.train.ulysses)
        self.engine = spec.engine_class()(
            model_dir, dtype=resolve_dtype(dtype, device), device=device, seed=seed, **AdamWSettings.from_config(o).engine_kwargs(), **engine_kwargs,
        )
        self.rate = ScheduledRate(o, total_steps)  # critic.optim.lr_scheduler_type, once per RL step
        # critic.fsdp_config.param_offload / optimizer_offload: the value model's state on the device
        # only in this role's phases, as the policy's (nothing moves on the CPU)
        self.residency = Residency(self.engine, names=(names.CRITIC_OFFLOAD_S, names.CRITIC_ONLOAD_S))
        self.residency.release()

    # ----------------------------------------------------------------- nodes
    def compute_values(self, table: pa.Table, column: str = "values") -> pa.Table:
        """A one-column table: the value of every response token of ``table``."""
        budget = self.cfg.forward_max_token_len_per_gpu if self.cfg.use_dynamic_bsz else 0
        batch = PackedBatch.from_table(table).with_token_budget(budget).with_shared_prompts(self.cfg.use_prefix_grouper)
        with self.residency.resident():
            values_T = self.engine.forward_values(batch, micro_batch_size=self.cfg.forward_micro_batch_size_per_gpu)
        return pa.table({column: experience.list_column(values_T, batch.response_cu_B1, experience.TOKEN_FLOATS)})

    def update(self, table: pa.Table, mini_batch_rows: int) -> dict[str, float]:
        """``ppo_epochs`` passes over this rank's share, one optimizer step per mini-batch of
        ``mini_batch_rows`` rows, regressing the values on ``returns`` with value clipping around
        the ``values`` the advantages were computed with."""
        batch = PackedBatch.from_table(table, ("values", "returns", "response_mask"))
        self.rate.before_update(self.engine.optimizer)
        with self.residency.resident(optimizer=True):
            stats = run_epochs(batch, epochs=self.cfg.ppo_epochs, mini_batch_rows=mini_batch_rows, step=self._step,
                               prefix=names.CRITIC)
        return {**stats, **self.residency.take_metrics()}

    def _step(self, mini: PackedBatch) -> dict[str, float]:
        cfg = self.cfg
        mode = cfg.loss_agg_mode
        (denominator,) = self.engine.all_reduce_sum(
            [agg_denominator(mini.token_fields["response_mask"], mini.response_cu_B1, mode)]
        )

        def loss_fn(vpreds_T: torch.Tensor, mb: PackedBatch):
            return critic_loss(vpreds_T, mb.token_fields, mb.response_cu_B1, mode=mode, cliprange_value=cfg.cliprange_value,
                               max_response_length=self.response_length, denominator=denominator)

        mini = mini.with_token_budget(cfg.ppo_max_token_len_per_gpu if cfg.use_dynamic_bsz else 0)
        mini = mini.with_shared_prompts(cfg.use_prefix_grouper)
        return self.engine.train_step_values(mini, micro_batch_size=cfg.ppo_micro_batch_size_per_gpu, loss_fn=loss_fn)

    # ----------------------------------------------------------------- state
    def resume_state(self) -> dict:
        """Every rank: its part of a checkpoint's resume record (``trainer.checks.resume``, under
        ``critic``; :func:`flowrl.checks.resume.engine_state`), as the policy role's."""
        from flowrl.catalog.backends import CheckpointKind
        from flowrl.checks.resume import engine_state

        with self.residency.resident(optimizer=True):
            return engine_state(self.engine, self.rank, sharded=self.checkpoint_kind is CheckpointKind.SHARDED)

    def save_checkpoint(self, path: str, *, step: int, extra: dict) -> dict | None:
        """Every rank: the value model's parameters and AdamW state as checkpoint ``path``
        (``extra`` plus ``optim_step`` in its meta); ``{"path", "optim_step"}`` on rank 0, None
        elsewhere (dp: rank 0 writes the full state; fsdp, megatron: each rank its chunks, the
        head under the dp critic's ``score.*`` names)."""
        with self.residency.resident(optimizer=True):
            return checkpoints.save(self.engine, self.checkpoint_kind, path, rank=self.rank, step=step, extra=extra)

    def load_checkpoint(self, path: str) -> int:
        """Every rank: restore checkpoint ``path``; the optimizer step."""
        self.rate.resume(path)
        with self.residency.resident(optimizer=True):
            return checkpoints.load(self.engine, self.checkpoint_kind, path)

    def close(self) -> None:
        self.engine.close()

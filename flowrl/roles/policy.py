"""The trained policy: log-probs before the update, and the PPO-style update itself.

The loss is assembled from registered pieces (policy loss, KL estimator, aggregation), so adding
a loss means registering one function in ``flowrl.algos``. Denominators are global (summed over
data-parallel ranks) so each mini-batch's gradient equals the single-process one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import torch

from flowrl.algos import KL_ESTIMATORS, POLICY_LOSSES, agg_denominator, agg_loss
from flowrl.backends.train import TRAIN_BACKENDS
from flowrl.config.schema import ActorConfig
from flowrl.data import experience
from flowrl.data.packed import PackedBatch
from flowrl.roles.epochs import run_epochs

if TYPE_CHECKING:
    from flowrl.backends.reshard import ReshardJob


class PolicyRole:
    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        model_dir: str,
        actor: ActorConfig,
        dtype: str = "float32",
        temperature: float = 1.0,
        response_length: int = 1,
        use_old_logprobs: bool = True,
        seed: int = 0,
        engine_kwargs: dict | None = None,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.cfg = actor
        self.temperature = temperature
        self.response_length = response_length
        self.use_old_logprobs = use_old_logprobs
        o = actor.optim
        engine_cls = TRAIN_BACKENDS.get(actor.strategy)
        self.engine = engine_cls(
            model_dir,
            trainable=True,
            dtype=dtype,
            lr=o.lr,
            weight_decay=o.weight_decay,
            betas=o.betas,
            eps=o.eps,
            grad_clip=o.grad_clip,
            seed=seed,
            **(engine_kwargs or {}),
        )
        self.policy_loss = POLICY_LOSSES.get(actor.policy_loss)
        self.kl_estimator = KL_ESTIMATORS.get(actor.kl_loss_type)

    # ----------------------------------------------------------------- nodes
    def compute_logprobs(self, table: pa.Table, column: str = "old_logprobs") -> pa.Table:
        batch = PackedBatch.from_table(table)
        logp_T, _ = self.engine.forward_logprobs(
            batch, micro_batch_size=self.cfg.ppo_micro_batch_size_per_gpu, temperature=self.temperature
        )
        return pa.table({column: experience.list_column(logp_T, batch.response_cu_B1, experience.TOKEN_FLOATS)})

    def update(self, table: pa.Table, mini_batch_rows: int) -> dict[str, float]:
        """``ppo_epochs`` passes over this rank's share, one optimizer step per mini-batch of
        ``mini_batch_rows`` rows (this rank's part of ``ppo_mini_batch_size * n``)."""
        fields = ["advantages", "response_mask"]
        if self.use_old_logprobs:
            fields.append("old_logprobs")
        if self.cfg.use_kl_loss:
            fields.append("ref_logprobs")
        batch = PackedBatch.from_table(table, tuple(fields))
        return run_epochs(batch, epochs=self.cfg.ppo_epochs, mini_batch_rows=mini_batch_rows, step=self._step, prefix="actor")

    def _step(self, mini: PackedBatch) -> dict[str, float]:
        cfg = self.cfg
        mode = cfg.loss_agg_mode
        (denominator,) = self.engine.all_reduce_sum(
            [agg_denominator(mini.token_fields["response_mask"], mini.response_cu_B1, mode)]
        )

        def agg(x_T: torch.Tensor, mb: PackedBatch) -> torch.Tensor:
            return agg_loss(
                x_T,
                mb.token_fields["response_mask"],
                mb.response_cu_B1,
                mode,
                denominator=denominator,
                max_response_length=self.response_length,
            )

        def loss_fn(logp_T: torch.Tensor, entropy_T: torch.Tensor | None, mb: PackedBatch):
            f = mb.token_fields
            old_T = f["old_logprobs"] if self.use_old_logprobs else logp_T.detach()
            pg_T, stats = self.policy_loss(
                logp_T,
                old_T,
                f["advantages"],
                f["response_mask"],
                mb.response_cu_B1,
                clip_ratio_low=cfg.clip_ratio_low,
                clip_ratio_high=cfg.clip_ratio_high,
                clip_ratio_c=cfg.clip_ratio_c,
            )
            pg_loss = agg(pg_T, mb)
            loss = pg_loss
            out = {k: v.detach() for k, v in stats.items()}
            # Reported per token (not scaled by the global denominator), for readable metrics.
            scale = denominator / max(agg_denominator(f["response_mask"], mb.response_cu_B1, mode), 1.0)
            out["pg_loss"] = pg_loss.detach() * scale
            if entropy_T is not None:
                entropy = agg(entropy_T, mb)
                out["entropy"] = entropy.detach() * scale
                if cfg.entropy_coeff:
                    loss = loss - cfg.entropy_coeff * entropy
            if cfg.use_kl_loss:
                kl = agg(self.kl_estimator(logp_T, f["ref_logprobs"]), mb)
                loss = loss + cfg.kl_loss_coef * kl
                out["kl_loss"] = kl.detach() * scale
            return loss, out

        return self.engine.train_step(
            mini,
            micro_batch_size=cfg.ppo_micro_batch_size_per_gpu,
            loss_fn=loss_fn,
            temperature=self.temperature,
        )

    # ----------------------------------------------------------------- weights
    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        return self.engine.hf_state_dict()

    def reshard(self, job: "ReshardJob") -> dict:
        """Send this rank's parameter shards to the generation layout (``flowrl.backends.reshard``)."""
        from flowrl.backends.reshard import run_rank

        return run_rank(job, src_rank=self.rank, src=self.engine.reshard_source())

    def grad_state_dict(self) -> dict[str, torch.Tensor]:
        return self.engine.grad_state_dict()

    def checkpoint_state(self) -> dict | None:
        """Rank 0: ``{"params", "optim", "optim_step"}`` (see the engine); other ranks: None."""
        return self.engine.checkpoint_state() if self.rank == 0 else None

    def load_checkpoint(self, params: dict, optim: dict | None = None, optim_step: int = 0) -> None:
        """Every rank: restore the full parameters and optimizer state of a checkpoint."""
        self.engine.load_checkpoint(params, optim, optim_step)

    def save_checkpoint_sharded(self, path: str, step: int, extra: dict | None = None) -> dict | None:
        """Every rank (megatron): write this rank's own chunks; rank 0 commits. Returns
        ``{"path", "optim_step"}`` on rank 0."""
        return self._sharded_engine("save_checkpoint_sharded").save_checkpoint_sharded(path, step=step, extra=extra)

    def load_checkpoint_sharded(self, path: str) -> int:
        """Every rank (megatron): read only the chunks this rank holds; returns the optimizer step."""
        return self._sharded_engine("load_checkpoint_sharded").load_checkpoint_sharded(path)

    def _sharded_engine(self, method: str):  # noqa: ANN202 - the engine
        if not hasattr(self.engine, method):
            raise TypeError(f"{method}: the {self.cfg.strategy} backend saves full states (checkpoint_state)")
        return self.engine

    def save_hf(self, directory: str) -> None:
        if self.rank == 0:
            self.engine.save_hf(directory)

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

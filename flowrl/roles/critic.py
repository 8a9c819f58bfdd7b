"""The PPO critic: values of the sampled responses, and the clipped value-loss update.

Holds a value model (``TorchDPValueEngine``: the policy's model family with a one-output head)
and its own optimizer. Like ``PolicyRole``, denominators are global (summed over data-parallel
ranks), so each mini-batch's gradient equals the single-process one.
"""

from __future__ import annotations


import pyarrow as pa
import torch

from flowrl.algos import agg_denominator, agg_loss, value_loss
from flowrl.backends.train.value_dp import TorchDPValueEngine
from flowrl.config.schema import CriticConfig
from flowrl.data import experience
from flowrl.data.packed import PackedBatch
from flowrl.roles.epochs import run_epochs


class CriticRole:
    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        model_dir: str,
        critic: CriticConfig,
        dtype: str = "float32",
        response_length: int = 1,
        seed: int = 0,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.cfg = critic
        self.response_length = response_length
        o = critic.optim
        if critic.strategy == "megatron":  # the same value model on megatron-core (dp x tp x pp)
            from flowrl.backends.train.megatron.value import MegatronValueTrainEngine

            self.engine = MegatronValueTrainEngine(
                model_dir, tp=critic.tensor_model_parallel_size, pp=critic.pipeline_model_parallel_size,
                dp=critic.data_parallel_size, dtype=dtype, lr=o.lr, weight_decay=o.weight_decay, betas=o.betas,
                eps=o.eps, grad_clip=o.grad_clip, seed=seed,
            )
            return
        self.engine = TorchDPValueEngine(
            model_dir, trainable=True, dtype=dtype, lr=o.lr, weight_decay=o.weight_decay, betas=o.betas,
            eps=o.eps, grad_clip=o.grad_clip, seed=seed,
        )

    # ----------------------------------------------------------------- nodes
    def compute_values(self, table: pa.Table, column: str = "values") -> pa.Table:
        """A one-column table: the value of every response token of ``table``."""
        batch = PackedBatch.from_table(table)
        values_T = self.engine.forward_values(batch, micro_batch_size=self.cfg.forward_micro_batch_size_per_gpu)
        return pa.table({column: experience.list_column(values_T, batch.response_cu_B1, experience.TOKEN_FLOATS)})

    def update(self, table: pa.Table, mini_batch_rows: int) -> dict[str, float]:
        """``ppo_epochs`` passes over this rank's share, one optimizer step per mini-batch of
        ``mini_batch_rows`` rows, regressing the values on ``returns`` with value clipping around
        the ``values`` the advantages were computed with."""
        batch = PackedBatch.from_table(table, ("values", "returns", "response_mask"))
        return run_epochs(batch, epochs=self.cfg.ppo_epochs, mini_batch_rows=mini_batch_rows, step=self._step, prefix="critic")

    def _step(self, mini: PackedBatch) -> dict[str, float]:
        cfg = self.cfg
        mode = cfg.loss_agg_mode
        (denominator,) = self.engine.all_reduce_sum(
            [agg_denominator(mini.token_fields["response_mask"], mini.response_cu_B1, mode)]
        )

        def loss_fn(vpreds_T: torch.Tensor, mb: PackedBatch):
            f = mb.token_fields
            loss_T, stats = value_loss(
                vpreds_T, f["values"], f["returns"], f["response_mask"], cliprange_value=cfg.cliprange_value
            )
            loss = agg_loss(
                loss_T, f["response_mask"], mb.response_cu_B1, mode,
                denominator=denominator, max_response_length=self.response_length,
            )
            # Reported per token (not scaled by the global denominator), for readable metrics.
            scale = denominator / max(agg_denominator(f["response_mask"], mb.response_cu_B1, mode), 1.0)
            return loss, {"vf_loss": loss.detach() * scale, **stats}

        return self.engine.train_step_values(mini, micro_batch_size=cfg.ppo_micro_batch_size_per_gpu, loss_fn=loss_fn)

    # ----------------------------------------------------------------- state
    def checkpoint_state(self) -> dict | None:
        """Rank 0: ``{"params", "optim", "optim_step"}`` of the value model; other ranks: None."""
        if self.cfg.strategy == "megatron":  # refused at config time (trainer._check_megatron_critic)
            raise NotImplementedError("critic checkpoints are not supported with critic.strategy=megatron")
        return self.engine.checkpoint_state() if self.rank == 0 else None

    def load_checkpoint(self, params: dict, optim: dict | None = None, optim_step: int = 0) -> None:
        self.engine.load_checkpoint(params, optim, optim_step)

    def close(self) -> None:
        if self.cfg.strategy == "megatron":
            self.engine.close()

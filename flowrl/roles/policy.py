"""The trained policy: log-probs before the update, and the PPO-style update itself.

The loss is assembled from registered pieces (policy loss, KL estimator, aggregation), so adding
a loss means registering one function in ``flowrl.algos``. Denominators are global (summed over
data-parallel ranks) so each mini-batch's gradient equals the single-process one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import torch

from flowrl.algos import KL_ESTIMATORS, POLICY_LOSSES, agg_denominator
from flowrl.algos.actor_loss import ActorLoss, actor_loss
from flowrl.backends.interfaces import ComputesReferenceLogprobs, HasLora, HasModel
from flowrl.backends.train.optim import AdamWSettings, ScheduledRate
from flowrl.catalog.backends import TRAIN_BACKENDS, CheckpointKind
from flowrl.config import ActorConfig
from flowrl.config.batching_auto import settled
from flowrl.data import experience
from flowrl.data.packed import PackedBatch
from flowrl.metrics import names
from flowrl.models.moe_routing import MoeLossSettings, with_routes
from flowrl.parallel.dtypes import resolve_dtype
from flowrl.roles import checkpoints
from flowrl.roles.accounting import update_mfu
from flowrl.roles.epochs import run_epochs
from flowrl.roles.memory import Residency

if TYPE_CHECKING:
    from flowrl.backends.generate.vllm_nccl import NcclSyncJob
    from flowrl.backends.reshard import AdapterJob, ReshardJob


def _policy_loss(name: str, bypass: dict | None):
    """The registered policy loss ``name``, or bypass mode's (``algorithm.rollout_is_bypass``:
    ``flowrl.algos.rollout_correction.bypass_policy_loss`` with ``bypass``'s settings)."""
    if bypass is None:
        return POLICY_LOSSES.get(name)
    from flowrl.algos.rollout_correction import bypass_loss_fn

    return bypass_loss_fn(bypass)


class PolicyRole:
    _nccl_sender = None
    """This rank's NCCL communicators to the vLLM engines it sends to (``vllm_nccl``; None: none yet)."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        model_dir: str,
        actor: ActorConfig,
        dtype: str = "float32",
        device: str = "cpu",
        temperature: float = 1.0,
        response_length: int = 1,
        use_old_logprobs: bool = True,
        seed: int = 0,
        engine_kwargs: dict | None = None,
        ref_micro_batch_size: int | None = None,
        total_steps: int = 0,
        bypass: dict | None = None,
    ) -> None:
        """``device``: the rank's (``cuda:0`` on a GPU rank, from its device plan entry);
        ``dtype``: ``model.dtype``, the compute dtype (``auto``: bf16 on a GPU, fp32 on the CPU)."""
        self.rank, self.world_size = rank, world_size
        self.device = device
        self.ref_micro_batch_size = ref_micro_batch_size or actor.ppo_micro_batch_size_per_gpu
        self.cfg = settled(actor)  # as resolved by the run (roles.specs), else auto off
        self.temperature = temperature
        self.response_length = response_length
        self.use_old_logprobs = use_old_logprobs
        o = actor.optim
        spec = TRAIN_BACKENDS.spec(actor.strategy)
        self.checkpoint_kind = spec.checkpoint
        engine_cls = spec.engine_class()
        self.engine = engine_cls(
            model_dir,
            trainable=True,
            dtype=resolve_dtype(dtype, device),
            device=device,
            seed=seed,
            **AdamWSettings.from_config(o).engine_kwargs(),
            **(engine_kwargs or {}),
            **({"freeze_vision_tower": True} if actor.freeze_vision_tower else {}),  # a VLM's (flowrl.models.vlm)
        )
        # MoE: the routers' loss coefficients (dp/fsdp engines; flowrl.models.moe_routing)
        self.engine.moe_losses = MoeLossSettings(aux_loss_coeff=actor.moe_aux_loss_coeff,
                                                 z_loss_coeff=actor.moe_z_loss_coeff)
        self.rate = ScheduledRate(o, total_steps)  # actor.optim.lr_scheduler_type, once per RL step
        # perf/mfu/actor on a GPU of known peak; a replica spans tp x pp of the group's ranks
        self.mfu = update_mfu(model_dir, device, num_devices=max(1, world_size // max(1, actor.data_parallel_size)))
        self.loss = ActorLoss(
            policy_loss=_policy_loss(actor.policy_loss, bypass), kl_estimator=KL_ESTIMATORS.get(actor.kl_loss_type),
            mode=actor.loss_agg_mode, max_response_length=response_length, use_old_logprobs=use_old_logprobs,
            clip_ratio_low=actor.clip_ratio_low, clip_ratio_high=actor.clip_ratio_high, clip_ratio_c=actor.clip_ratio_c,
            entropy_coeff=actor.entropy_coeff, use_kl_loss=actor.use_kl_loss, kl_loss_coef=actor.kl_loss_coef,
        )
        # fsdp_config.param_offload / optimizer_offload: the state on the device only in this role's
        # phases, so generation between them has the GPU (nothing moves on the CPU)
        self.residency = Residency(self.engine)
        self.residency.release()

    # ----------------------------------------------------------------- nodes
    def compute_logprobs(self, table: pa.Table, column: str = "old_logprobs") -> pa.Table:
        batch = self._log_prob_batch(table)
        with self.residency.resident():
            logp_T, _ = self.engine.forward_logprobs(
                batch, micro_batch_size=self.cfg.ppo_micro_batch_size_per_gpu, temperature=self.temperature
            )
        return pa.table({column: experience.list_column(logp_T, batch.response_cu_B1, experience.TOKEN_FLOATS)})

    def compute_logprobs_with_sum_pi_squared(self, table: pa.Table, column: str = "old_logprobs") -> pa.Table:
        """``compute_logprobs`` plus ``sum_pi_squared`` (``sum_v pi(v)**2`` per token, from the same
        logits): ``algorithm.adv_estimator=optimal_token_baseline``'s inputs."""
        batch = self._log_prob_batch(table)
        with self.residency.resident():
            logp_T, pi2_T = self.engine.forward_logprobs(
                batch, micro_batch_size=self.cfg.ppo_micro_batch_size_per_gpu, temperature=self.temperature,
                with_entropy=True, token_stat="sum_pi_squared",
            )
        return pa.table({column: experience.list_column(logp_T, batch.response_cu_B1, experience.TOKEN_FLOATS),
                         "sum_pi_squared": experience.list_column(pi2_T, batch.response_cu_B1, experience.TOKEN_FLOATS)})

    def compute_ref_logprobs(self, table: pa.Table, column: str = "ref_logprobs") -> pa.Table:
        """With LoRA (``model.lora_rank`` > 0): the reference policy's log-probs, those of the base
        model with the adapters disabled, in this process (no reference group, no second copy)."""
        if not isinstance(self.engine, ComputesReferenceLogprobs):
            raise TypeError(f"actor.strategy={self.cfg.strategy}: its engine does not compute reference log-probs "
                            "(LoRA's base model); fix: set model.lora_rank=0 (a reference group computes them)")
        batch = self._log_prob_batch(table)
        with self.residency.resident():
            logp_T = self.engine.reference_logprobs(batch, micro_batch_size=self.ref_micro_batch_size,
                                                    temperature=self.temperature)
        return pa.table({column: experience.list_column(logp_T, batch.response_cu_B1, experience.TOKEN_FLOATS)})

    def _log_prob_batch(self, table: pa.Table) -> PackedBatch:
        """``table`` for a log-prob pass: micro-batches by ``log_prob_max_token_len_per_gpu`` tokens
        (``log_prob_use_dynamic_bsz``) or by rows, each group's prompt once (``use_prefix_grouper``)."""
        budget = self.cfg.log_prob_max_token_len_per_gpu if self.cfg.log_prob_use_dynamic_bsz else 0
        return self._routed(PackedBatch.from_table(table), table).with_token_budget(budget).with_shared_prompts(
            self.cfg.use_prefix_grouper)

    def _routed(self, batch: PackedBatch, table: pa.Table) -> PackedBatch:
        """With ``actor.router_replay``: ``batch`` with the rollout's recorded experts (replayed)."""
        return with_routes(batch, table) if self.cfg.router_replay else batch

    def update(self, table: pa.Table, mini_batch_rows: int) -> dict[str, float]:
        """``ppo_epochs`` passes over this rank's share, one optimizer step per mini-batch of
        ``mini_batch_rows`` rows (this rank's part of ``ppo_mini_batch_size * n``)."""
        fields = ["advantages", "response_mask"]
        if self.use_old_logprobs:
            fields.append("old_logprobs")
        if self.cfg.use_kl_loss:
            fields.append("ref_logprobs")
        batch = self._routed(PackedBatch.from_table(table, tuple(fields)), table)
        self.rate.before_update(self.engine.optimizer)
        with self.residency.resident(optimizer=True):
            stats = run_epochs(batch, epochs=self.cfg.ppo_epochs, mini_batch_rows=mini_batch_rows, step=self._step,
                               prefix=names.ACTOR, mfu=self.mfu)
        return {**stats, **self.residency.take_metrics()}

    def _step(self, mini: PackedBatch) -> dict[str, float]:
        """One optimizer step on a mini-batch: the global denominator, then the engine's
        accumulated step with :func:`flowrl.algos.actor_loss.actor_loss` per micro-batch."""
        (denominator,) = self.engine.all_reduce_sum(
            [agg_denominator(mini.token_fields["response_mask"], mini.response_cu_B1, self.cfg.loss_agg_mode)]
        )

        def loss_fn(logp_T: torch.Tensor, entropy_T: torch.Tensor | None, mb: PackedBatch):
            return actor_loss(logp_T, entropy_T, mb.token_fields, mb.response_cu_B1, spec=self.loss, denominator=denominator)

        budget = self.cfg.ppo_max_token_len_per_gpu if self.cfg.use_dynamic_bsz else 0
        return self.engine.train_step(
            mini.with_token_budget(budget).with_shared_prompts(self.cfg.use_prefix_grouper),
            micro_batch_size=self.cfg.ppo_micro_batch_size_per_gpu,
            loss_fn=loss_fn,
            temperature=self.temperature,
        )

    def train_supervised(self, table: pa.Table, *, loss: str, mini_batch_rows: int, options: dict | None = None) -> dict[str, float]:
        """SFT, DPO (the ``sft``/``dpo`` families): ``actor.ppo_epochs`` passes over this rank's
        share with the :class:`~flowrl.algos.supervised.SupervisedLoss` at import string ``loss``
        (``options``: its keyword arguments), one optimizer step per ``mini_batch_rows`` rows."""
        from flowrl.roles import supervised

        self.rate.before_update(self.engine.optimizer)
        with self.residency.resident(optimizer=True):
            stats = supervised.train(self.engine, self.cfg, table, loss=loss, mini_batch_rows=mini_batch_rows,
                                     options=options or {}, mfu=self.mfu)
        return {**stats, **self.residency.take_metrics()}

    def supervised_logprobs(self, table: pa.Table, column: str = "logprobs") -> pa.Table:
        """The response-token log-probs at temperature 1 (the supervised families' validation)."""
        from flowrl.roles import supervised

        with self.residency.resident():
            return supervised.logprobs(self.engine, self.cfg, table, column)

    # ----------------------------------------------------------------- weights
    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        with self.residency.resident():
            return self.engine.hf_state_dict()

    def resume_state(self) -> dict:
        """Every rank: its part of a checkpoint's resume record (``trainer.checks.resume``,
        :func:`flowrl.checks.resume.engine_state`): the parameters' fingerprints (rank 0), the
        optimizer's step and state norms."""
        from flowrl.checks.resume import engine_state

        with self.residency.resident(optimizer=True):
            return engine_state(self.engine, self.rank, sharded=self.checkpoint_kind is CheckpointKind.SHARDED)

    def reshard(self, job: "ReshardJob | AdapterJob | NcclSyncJob", fingerprint: bool = False) -> dict:
        """Send this rank's parameter shards to the generation layout (``flowrl.backends.reshard``);
        an ``AdapterJob`` (LoRA into vLLM): the adapters only, from rank 0; an ``NcclSyncJob``
        (split GPU pools into vLLM): the planner's gather onto the sender ranks, which broadcast
        over vLLM's NCCL weight transfer (:mod:`flowrl.backends.generate.vllm_nccl`). ``fingerprint``: with
        this rank's fingerprints of what it sent (``trainer.checks.weight_sync``, :mod:`flowrl.checks.fingerprint`)."""
        from flowrl.backends.generate.vllm_nccl import NcclSyncJob, run_trainer_rank
        from flowrl.backends.reshard import AdapterJob, run_adapter_rank, run_rank
        from flowrl.checks import fingerprint as fp

        with self.residency.resident():
            if isinstance(job, AdapterJob):
                adapters = self.adapters_whole()
                stats = run_adapter_rank(job, src_rank=self.rank, adapters=adapters)[0]
                if not fingerprint or self.rank != 0:
                    return fp.attach(stats) if fingerprint else stats
                from flowrl.backends.train.lora import sync_names

                return fp.attach(stats, fp.adapter_source_report(job, sync_names(adapters)))
            src = self.engine.reshard_source()
            if isinstance(job, NcclSyncJob):  # vLLM's NCCL weight transfer (split GPU pools)
                stats, self._nccl_sender = run_trainer_rank(job, self.rank, src, self._nccl_sender,
                                                            fingerprint=fingerprint)
                return stats
            stats = run_rank(job, src_rank=self.rank, src=src)
            return fp.attach(stats, fp.source_report(job, self.rank, src)) if fingerprint else stats

    def adapters_whole(self) -> dict[str, torch.Tensor]:
        """What LoRA trains (the adapters, and modules peft trains whole), by the trainer's names,
        whole (FSDP: gathered; every rank calls it)."""
        from flowrl.backends.train.fsdp_tensors import full

        assert isinstance(self.engine, HasModel), "LoRA adapters come from an engine with a model"
        return {n: full(p.detach()).cpu() for n, p in self.engine.model.named_parameters() if p.requires_grad}

    def grad_state_dict(self) -> dict[str, torch.Tensor]:
        with self.residency.resident():
            return self.engine.grad_state_dict()

    def save_checkpoint(self, path: str, *, step: int, extra: dict) -> dict | None:
        """Every rank: checkpoint ``path`` of step ``step`` with ``extra`` in its meta (plus
        ``optim_step``); ``{"path", "optim_step"}`` on rank 0, None elsewhere. ``full`` backends:
        rank 0 writes the full state; ``sharded``: each rank its own chunks, rank 0 commits.
        With LoRA the checkpoint holds the adapters only, ``extra["lora"]`` their settings."""
        lora = self._lora()
        extra = {**extra, "lora": lora.to_dict()} if lora is not None else extra
        with self.residency.resident(optimizer=True):
            return checkpoints.save(self.engine, self.checkpoint_kind, path, rank=self.rank, step=step, extra=extra)

    def load_checkpoint(self, path: str) -> int:
        """Every rank: restore parameters and optimizer state from checkpoint ``path`` (``full``:
        every rank reads the full arrays; ``sharded``: only its chunks); the optimizer step.
        ValueError when the checkpoint's LoRA adapters (or their absence) differ from this run's."""
        from flowrl.checkpoint import load_meta

        lora = self._lora()
        saved = (load_meta(path).get("extra") or {}).get("lora")
        mine = lora.to_dict() if lora is not None else None
        if saved != mine:
            raise ValueError(f"checkpoint {path} holds LoRA adapters {saved} (None: every weight), this run "
                             f"model.lora_rank/lora_alpha/target_modules={mine}; fix: resume with the "
                             "checkpoint's model.lora_* settings, or start a fresh run (trainer.resume_mode=disable)")
        self.rate.resume(path)
        with self.residency.resident(optimizer=True):
            return checkpoints.load(self.engine, self.checkpoint_kind, path)

    def _lora(self):  # noqa: ANN202 - a LoraSpec, or None (every weight trains)
        return self.engine.lora if isinstance(self.engine, HasLora) else None

    def save_hf(self, directory: str) -> None:
        """``full`` backends: rank 0 writes; ``sharded``: every rank gathers, rank 0 writes."""
        if self.rank == 0 or self.checkpoint_kind is CheckpointKind.SHARDED:
            with self.residency.resident():
                self.engine.save_hf(directory)

    def close(self) -> None:
        self.engine.close()

"""MegatronEngine: one rank of a megatron-core (dp x tp x pp, and ep x etp for the experts of a
mixture-of-experts model) policy, loaded from an HF directory.

Constructed inside an initialised torch.distributed process (gloo on CPU, nccl on GPU) on every
rank of the world. Order of construction, as in torchtitan's parallelize: model-parallel groups
(TP, PP, then DP is what remains), one GPTModel chunk per (virtual) pipeline stage holding only this
rank's TP shard, HF weights loaded into it, megatron DDP around each chunk, then the megatron
optimizer (AdamW, decoupled weight decay, none on norms and biases) with gradient clipping.

Loss scaling (megatron-core 0.16.1, pipeline_parallel/schedules.py:256-269): a loss function that
returns ``(loss, num_tokens, stats)`` with ``config.calculate_per_token_loss=True`` is used as is
(no division by the number of micro-batches or tokens), and DDP then sums (not averages) gradients
over data-parallel ranks (distributed_data_parallel.py:254-259). The schedule would divide the
gradients by the summed ``num_tokens`` inside ``finalize_model_grads`` if
``config.finalize_model_grads_func`` were set (schedules.py:677-684); the engine leaves it unset
and calls ``finalize_model_grads(chunks, num_tokens=None)`` itself. So the gradient is that of the
sum over micro-batches and data-parallel ranks of ``loss_fn``'s losses: callers normalise by global
token counts.

Shapes: B = micro-batch rows, S = padded sequence length, V = this rank's vocabulary slice,
T = response tokens (flattened over the micro-batch's items).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed import finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func

from flowrl.backends.train.megatron.batching import MicroBatch, make_micro_batches
from flowrl.backends.train.megatron.compat import apply_cpu_compat, define_missing_te_names
from flowrl.backends.train.megatron.convert import (
    arch_spec, check_expert_layout, chunk_role, experts_to_global, fuse_experts, hf_to_megatron,
    is_expert_param, megatron_to_hf)
from flowrl.backends.train.megatron.model import build_gpt_model, transformer_config_from_hf
from flowrl.backends.train.megatron.moe_stats import MoeStats
from flowrl.backends.train.megatron.offload import MegatronOffload
from flowrl.backends.train.megatron.vocab_parallel import vocab_parallel_logprobs
from flowrl.metrics import names
from flowrl.parallel.mesh import ParallelDims, padded_vocab_size, validate_model_layout

log = logging.getLogger(__name__)

LossFn = Callable[[torch.Tensor, torch.Tensor, list, torch.Tensor],
                  tuple[torch.Tensor, dict[str, torch.Tensor]]]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja")


def check_expert_mesh(*, world: int, tp: int, pp: int, ep: int, etp: int, arch) -> None:
    """The experts' mesh: ``ep`` divides the experts, ``etp`` their width, and ``etp * ep * pp``
    the world (megatron's expert RankGenerator: expert-data-parallel ranks are what remains)."""
    for name, value in (("expert_model_parallel_size", ep), ("expert_tensor_parallel_size", etp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    check_expert_layout(arch, ep=ep, etp=etp)
    if world % (etp * ep * pp):
        raise ValueError(f"expert_tensor_parallel_size={etp} x expert_model_parallel_size={ep} x "
                         f"pipeline_model_parallel_size={pp} = {etp * ep * pp} does not divide the "
                         f"world of {world} ranks; make ep * etp divide the data- x tensor-parallel "
                         f"ranks ({world // pp})")


def _check_layout(*, world: int, dp: int, tp: int, pp: int, vpp: int | None, arch,
                  make_vocab_size_divisible_by: int, ep: int = 1, etp: int | None = None) -> None:
    if vpp is not None and arch.moe is not None:
        raise ValueError(f"virtual_pipeline_model_parallel_size={vpp} with a mixture-of-experts model "
                         "is not supported (its padding micro-batches have no tokens to route); set it to 1")
    dims = ParallelDims(dp=dp, tp=tp, pp=pp, vpp=vpp)
    dims.check_world_size(world, group="MegatronEngine")
    validate_model_layout(dims, num_attention_heads=arch.num_heads,
                          num_key_value_heads=arch.num_kv_heads, num_layers=arch.num_layers,
                          vocab_size=arch.vocab_size,
                          make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    if arch.moe is None and arch.ffn_hidden_size % tp:
        raise ValueError(f"tensor_model_parallel_size={tp} does not divide intermediate_size="
                         f"{arch.ffn_hidden_size}")
    check_expert_mesh(world=world, tp=tp, pp=pp, ep=ep, etp=tp if etp is None else etp, arch=arch)


def _engine_device(device: str | None) -> torch.device:
    """The engine's torch device: ``device`` (a bare ``cuda`` is the current CUDA device), or
    without one the current CUDA device where CUDA is available, else the CPU."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return dev


class MegatronEngine:
    """One rank's share of a megatron-core policy: forward log-probs, train steps, HF export."""

    #: checkpoint bytes this rank read to load its chunks from safetensors slices; None when it
    #: loaded the model whole (no safetensors files, other tensor names, the value model)
    checkpoint_bytes_read: int | None = None

    def __init__(self, model_dir: str, *, tp: int, pp: int, vpp: int | None = None, dp: int,
                 lr: float, weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, grad_clip: float = 1.0, use_distributed_optimizer: bool = False,
                 bf16: bool = False, seed: int = 0, make_vocab_size_divisible_by: int = 128,
                 device: str | None = None, param_offload: bool = False, grad_offload: bool = False,
                 optimizer_offload: bool = False, ep: int = 1, etp: int | None = None,
                 moe_aux_loss_coeff: float = 0.0, moe_z_loss_coeff: float | None = None):
        """``device``: the rank's (``cuda:0``: the GPU its process was given and set current;
        ``cpu``: gloo with the CPU shims of ``compat``); None: the current CUDA device where
        CUDA is available, else the CPU (the multi-process test harnesses). ``bf16``: bf16
        weights and compute, fp32 main parameters in the optimizer and fp32 gradient reduction
        (``flowrl.parallel.dtypes.megatron_bf16``). ``*_offload``: that state in host memory
        between phases (:meth:`offload_state`, ``flowrl.backends.train.megatron.offload``). ``ep`` /
        ``etp`` (None: tp) / ``moe_*_coeff``: a mixture-of-experts model's expert mesh, router losses."""
        from transformers import AutoConfig

        if not dist.is_initialized():
            raise RuntimeError("MegatronEngine needs torch.distributed.init_process_group first")
        if ps.model_parallel_is_initialized():
            raise RuntimeError("model-parallel state is already initialised; close() the previous "
                               "MegatronEngine of this process first")
        self.model_dir = model_dir
        self.hf_config = AutoConfig.from_pretrained(model_dir)
        self.arch = arch_spec(self.hf_config)
        vpp = None if vpp == 1 else vpp
        etp = tp if etp is None else etp  # megatron's default
        _check_layout(world=dist.get_world_size(), dp=dp, tp=tp, pp=pp, vpp=vpp, arch=self.arch,
                      make_vocab_size_divisible_by=make_vocab_size_divisible_by, ep=ep, etp=etp)
        self.tp, self.pp, self.vpp, self.dp, self.ep, self.etp = tp, pp, vpp, dp, ep, etp
        self.lr, self.weight_decay = lr, weight_decay
        self.make_vocab_size_divisible_by = make_vocab_size_divisible_by
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        self.device = _engine_device(device)
        if self.device.type == "cpu":
            apply_cpu_compat()
        define_missing_te_names()
        ps.initialize_model_parallel(tp, pp, virtual_pipeline_model_parallel_size=vpp,
                                     expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
        torch.manual_seed(seed)
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        self.config = transformer_config_from_hf(
            self.hf_config, tp=tp, pp=pp, vpp=vpp, params_dtype=self.dtype, use_cpu_initialization=self.device.type == "cpu",
            ep=ep, etp=etp, moe_aux_loss_coeff=moe_aux_loss_coeff, moe_z_loss_coeff=moe_z_loss_coeff)
        self.models = self._build_and_load()
        self.moe_stats = MoeStats(self.config, self.models) if self.arch.moe else None
        self.chunks = self._wrap_ddp(use_distributed_optimizer)
        self.config.no_sync_func = [c.no_sync for c in self.chunks]
        if len(self.chunks) == 1:
            self.config.no_sync_func = self.chunks[0].no_sync
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=lr, weight_decay=weight_decay, adam_beta1=betas[0],
                            adam_beta2=betas[1], adam_eps=eps, clip_grad=grad_clip, bf16=bf16,
                            params_dtype=self.dtype, main_params_dtype=torch.float32,
                            main_grads_dtype=torch.float32,
                            use_distributed_optimizer=use_distributed_optimizer),
            self.chunks)
        self.set_lr(lr)
        self._offload = MegatronOffload(self.device, params=param_offload, grads=grad_offload, optimizer=optimizer_offload,
                                        chunks=lambda: self.chunks, get_optimizer=lambda: self.optimizer, main_params=bf16)
        self.offloads = self._offload.offloads

    def offload_state(self) -> None:
        """After a phase: the switched-on state (parameters, gradients, optimizer) to the host."""
        self._offload.offload()

    def onload_state(self, *, optimizer: bool = False) -> None:
        """Before a phase: parameters and gradients back on the device, the optimizer's state too with ``optimizer``."""
        self._offload.onload(optimizer=optimizer)

    # ----------------------------------------------------------------------------- construction
    def _chunk_keys(self) -> list[tuple[int, int | None]]:
        pp_rank = ps.get_pipeline_model_parallel_rank()
        return [(pp_rank, v) for v in (range(self.vpp) if self.vpp else [None])]

    def _build_and_load(self) -> list[torch.nn.Module]:
        """This rank's model chunks, each filled with its shard of the checkpoint: read slice by
        slice from the safetensors files (this stage's layers, this rank's rows or columns: host
        memory for one shard, not the model), else, without safetensors files or with tensors
        under other names, converted from a whole ``from_pretrained`` load."""
        from flowrl.backends.train.tensor_source import safetensors_source

        with safetensors_source(self.model_dir) as source:
            try:
                if source is not None:
                    models = self._build_chunks(source)
                    self.checkpoint_bytes_read = source.bytes_read
                    return models
            except KeyError as missing:
                log.info("megatron: %s not in %s's safetensors by its HF name; loading the model whole",
                         missing, self.model_dir)
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        try:
            return self._build_chunks(hf_model.state_dict())
        finally:
            del hf_model

    def _build_chunks(self, hf_state: Any) -> list[torch.nn.Module]:
        models = []
        for pp_rank, vpp_rank in self._chunk_keys():
            pre, post = chunk_role(pp_rank=pp_rank, pp=self.pp, vpp_rank=vpp_rank, vpp=self.vpp)
            shard = hf_to_megatron(
                hf_state, self.hf_config, tp_rank=ps.get_tensor_model_parallel_rank(), tp=self.tp,
                pp_rank=pp_rank, pp=self.pp, vpp_rank=vpp_rank, vpp=self.vpp,
                ep_rank=ps.get_expert_model_parallel_rank(), ep=self.ep,
                etp_rank=ps.get_expert_tensor_parallel_rank(), etp=self.etp,
                make_vocab_size_divisible_by=self.make_vocab_size_divisible_by)
            model = build_gpt_model(self.hf_config, config=self.config, pre_process=pre,
                                    post_process=post, vp_stage=vpp_rank,
                                    make_vocab_size_divisible_by=self.make_vocab_size_divisible_by)
            self._load_shard(model, shard)
            del shard
            models.append(model.to(self.device))
        return models

    @classmethod
    def _load_shard(cls, model: torch.nn.Module, shard: dict[str, torch.Tensor]) -> None:
        """Copy a converted shard into a model chunk; names and shapes must match exactly."""
        own = cls._local_state(model)
        if set(own) != set(shard):
            raise RuntimeError(f"megatron chunk and converted shard disagree: only in model "
                               f"{sorted(set(own) - set(shard))}, only in shard "
                               f"{sorted(set(shard) - set(own))}")
        with torch.no_grad():
            for name, tensor in own.items():
                if tensor.shape != shard[name].shape:
                    raise RuntimeError(f"{name}: megatron shape {tuple(tensor.shape)} != "
                                       f"converted {tuple(shard[name].shape)}")
                tensor.copy_(shard[name])

    @staticmethod
    def _local_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {k: v for k, v in model.state_dict(keep_vars=True).items()
                if not k.endswith("_extra_state")}

    def _wrap_ddp(self, use_distributed_optimizer: bool) -> list[DistributedDataParallel]:
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=self.dtype != torch.float32, overlap_grad_reduce=False,
            use_distributed_optimizer=use_distributed_optimizer)
        return [DistributedDataParallel(config=self.config, ddp_config=ddp_config, module=m,
                                        disable_bucketing=i > 0)
                for i, m in enumerate(self.models)]

    def set_lr(self, lr: float) -> None:
        """Set the learning rate; weight decay is applied with megatron's wd_mult (0 on norms and
        biases), which megatron otherwise leaves to its LR scheduler."""
        self.lr = lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = self.weight_decay * group.get("wd_mult", 1.0)

    def close(self) -> None:
        """Release the model-parallel state so another engine can be built in this process."""
        if self.moe_stats is not None:
            self.moe_stats.close()
        self.models = self.chunks = self.optimizer = None
        ps.destroy_model_parallel()

    # ----------------------------------------------------------------------------- schedules
    def _vocab_slice(self) -> tuple[int, int]:
        per_rank = padded_vocab_size(self.arch.vocab_size, self.tp,
                                     self.make_vocab_size_divisible_by) // self.tp
        start = ps.get_tensor_model_parallel_rank() * per_rank
        return start, max(0, min(per_rank, self.arch.vocab_size - start))

    def _token_logprobs(self, mb: MicroBatch, logits_BSV: torch.Tensor, temperature: float,
                        stat: str = "entropy"):
        logits_TV = logits_BSV.reshape(-1, logits_BSV.shape[-1]).index_select(0, mb.index_T)
        target_T = mb.labels_BS.reshape(-1).index_select(0, mb.index_T)
        start, num_valid = self._vocab_slice()
        return vocab_parallel_logprobs(logits_TV, target_T, vocab_start=start, num_valid=num_valid,
                                       temperature=temperature, stat=stat,
                                       group=ps.get_tensor_model_parallel_group())

    def _run_schedule(self, batch: Sequence[dict], *, micro_batch_size: int, forward_only: bool,
                      loss_func: Callable[[MicroBatch, torch.Tensor], tuple]) -> list[dict]:
        micro_batches, seq_len = make_micro_batches(
            batch, micro_batch_size=micro_batch_size,
            num_microbatches_multiple=self.pp if self.vpp else 1,
            # sequence parallelism (MoE with tp > 1) splits the sequence over tp ranks
            seq_len_multiple=self.tp if self.config.sequence_parallel else 1)
        micro_batches = [mb.to(self.device) for mb in micro_batches]
        mask_11SS = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=self.device),
                               diagonal=1)[None, None]
        position_1S = torch.arange(seq_len, device=self.device)[None]

        if self.moe_stats is not None:
            self.moe_stats.begin(micro_batches, seq_len=seq_len, training=not forward_only)

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            kwargs = {}
            if self.moe_stats is not None:
                self.moe_stats.set_micro_batch(mb)
                kwargs["padding_mask"] = self.moe_stats.padding_mask(
                    mb, first_stage=model.module.pre_process, sequence_parallel=self.config.sequence_parallel)
            output = model(mb.tokens_BS, position_1S.expand_as(mb.tokens_BS), mask_11SS, **kwargs)
            return output, functools.partial(loss_func, mb)

        iterators = [iter(micro_batches) for _ in self.chunks]
        store = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iterators if self.vpp else iterators[0],
            model=self.chunks if self.vpp else self.chunks[0],
            num_microbatches=len(micro_batches), seq_length=seq_len,
            micro_batch_size=micro_batch_size, forward_only=forward_only)
        return sorted(store, key=lambda out: out["mb"])

    def _from_last_stage(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.pp > 1:
            dist.broadcast(tensor, src=ps.get_pipeline_model_parallel_last_rank(),
                           group=ps.get_pipeline_model_parallel_group())
        return tensor

    # ----------------------------------------------------------------------------- public API
    @torch.no_grad()
    def forward_logprobs(self, batch: list[dict], *, micro_batch_size: int,
                         temperature: float = 1.0, with_entropy: bool = False,
                         ) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        """Log-probs (and entropies) of each item's response tokens under ``logits / temperature``.

        Every tp/pp rank of a dp group passes the same ``batch``; all of them get the result.
        """
        def loss_func(mb, logits_BSV):
            logp_T, entropy_T = self._token_logprobs(mb, logits_BSV, temperature)
            zero = logp_T.new_zeros(())
            return zero, torch.tensor(mb.num_tokens, dtype=torch.int), {
                "mb": mb.index, "logp": logp_T, "entropy": entropy_T}

        for chunk in self.chunks:
            chunk.eval()
        store = self._run_schedule(batch, micro_batch_size=micro_batch_size, forward_only=True,
                                   loss_func=loss_func)
        lengths = [len(item["response_ids"]) for item in batch]
        both_2T = torch.zeros(2, sum(lengths), dtype=torch.float32, device=self.device)
        if store:  # last pipeline stage
            both_2T[0] = torch.cat([out["logp"] for out in store])
            both_2T[1] = torch.cat([out["entropy"] for out in store])
        both_2T = self._from_last_stage(both_2T).cpu().numpy()
        splits = np.cumsum(lengths)[:-1]
        logps = [a.astype(np.float32) for a in np.split(both_2T[0], splits)]
        entropies = [a.astype(np.float32) for a in np.split(both_2T[1], splits)]
        return logps, (entropies if with_entropy else None)

    def train_step(self, batch: list[dict], *, micro_batch_size: int, loss_fn: LossFn,
                   temperature: float = 1.0, token_stat: str = "entropy") -> dict[str, float]:
        """One optimizer step on ``batch`` (this rank's dp share); see the module docstring for how
        ``loss_fn``'s per-micro-batch losses are combined (summed, never averaged). ``token_stat``:
        ``loss_fn``'s second per-token tensor (``vocab_parallel.STATS``)."""
        def mb_loss(mb, logits_BSV):
            logp_T, entropy_T = self._token_logprobs(mb, logits_BSV, temperature, token_stat)
            return loss_fn(logp_T, entropy_T, mb.items, mb.cu_seqlens_B1)

        return self._train_schedule(batch, micro_batch_size=micro_batch_size, mb_loss=mb_loss)

    def _train_schedule(self, batch: list[dict], *, micro_batch_size: int,
                        mb_loss: Callable[[MicroBatch, torch.Tensor], tuple]) -> dict[str, float]:
        """One optimizer step; ``mb_loss(mb, output)`` maps a micro-batch and the last stage's
        output (logits, or values for ``value.py``) to ``(loss, stats)``."""
        def loss_func(mb, output):
            num_tokens = torch.tensor(mb.num_tokens, dtype=torch.int)
            if not mb.items:  # padding micro-batch: contributes nothing
                return output.sum() * 0.0, num_tokens, {"mb": mb.index}
            loss, stats = mb_loss(mb, output)
            stats = {k: float(v) for k, v in stats.items()}
            return loss, num_tokens, {"mb": mb.index, "loss": float(loss.detach()), **stats}

        for chunk in self.chunks:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        store = self._run_schedule(batch, micro_batch_size=micro_batch_size, forward_only=False,
                                   loss_func=loss_func)
        finalize_model_grads(self.chunks, num_tokens=None)
        update_ok, grad_norm, _ = self.optimizer.step()
        if not update_ok:
            raise FloatingPointError("optimizer step skipped (non-finite gradients)")
        stats = self._reduce_stats(store)
        if self.moe_stats is not None:
            stats.update(self.moe_stats.collect())
        return {**stats, names.GRAD_NORM: float(grad_norm), names.LR: self.lr}

    def _reduce_stats(self, store: list[dict]) -> dict[str, float]:
        """Mean of each stat over real micro-batches and dp ranks; 'loss' is summed instead."""
        stats = None
        if store:  # last pipeline stage
            real = [out for out in store if "loss" in out]
            keys = sorted({k for out in real for k in out if k != "mb"})
            local = torch.tensor([[sum(out.get(k, 0.0) for out in real) for k in keys],
                                  [sum(k in out for out in real) for k in keys]],
                                 dtype=torch.float64, device=self.device)
            dist.all_reduce(local, group=ps.get_data_parallel_group())
            stats = {k: float(local[0, i] if k == "loss" else local[0, i] / max(local[1, i], 1))
                     for i, k in enumerate(keys)}
        if self.pp > 1:
            box = [stats]
            dist.broadcast_object_list(box, src=ps.get_pipeline_model_parallel_last_rank(),
                                       group=ps.get_pipeline_model_parallel_group(),
                                       device=self.device)
            stats = box[0]
        return stats

    def gathered_shards(self, local_state: Callable[[torch.nn.Module], dict[str, torch.Tensor]] | None = None,
                        ) -> dict[tuple[int, int, int], dict[str, torch.Tensor]] | None:
        """Every (tp, pp, vpp) chunk's local state by megatron name (on CPU, from the dp rank 0
        replicas; experts from the expert-dp rank 0 ones, by global index), gathered on global
        rank 0; None elsewhere. ``local_state``: a chunk's tensors by name (default: its state;
        e.g. its parameters' gradients). Every rank must call it."""
        local_state = local_state or self._local_state
        shards: dict = {}
        dense_rank = ps.get_data_parallel_rank() == 0
        expert_rank = self.arch.moe is not None and ps.get_expert_data_parallel_rank() == 0
        tp_rank = ps.get_tensor_model_parallel_rank()
        num_local = self.arch.moe.num_experts // self.ep if self.arch.moe else 0
        for (pp_rank, vpp_rank), m in zip(self._chunk_keys(), self.models):
            state = {k: v.detach().cpu() for k, v in local_state(m).items()}
            if dense_rank:
                shards[(tp_rank, pp_rank, vpp_rank)] = {k: v for k, v in state.items() if not is_expert_param(k)}
            if expert_rank:  # experts by their global index, under the expert-tensor-parallel rank
                experts = {k: v for k, v in state.items() if is_expert_param(k)}
                shards[("expert", ps.get_expert_tensor_parallel_rank(), pp_rank, vpp_rank)] = experts_to_global(
                    experts, ep_rank=ps.get_expert_model_parallel_rank(), num_local_experts=num_local)
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(shards or None, gathered, dst=0)
        if dist.get_rank() != 0:
            return None
        merged: dict = {}
        for part in gathered:
            for key, shard in (part or {}).items():
                merged.setdefault(key[1:] if key[0] == "expert" else key, {}).update(shard)
        return merged

    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full HF-named state (parameter dtype, on CPU), complete on global rank 0, None
        elsewhere. Every rank must call it."""
        merged = self.gathered_shards()
        if merged is None:
            return None
        return megatron_to_hf(merged, self.hf_config, tp=self.tp, pp=self.pp, vpp=self.vpp, etp=self.etp)

    def reshard_source(self) -> dict[str, torch.Tensor]:
        """This rank's live parameter shards by megatron name (``model{v}.`` prefixes with vpp),
        as ``flowrl.parallel.shard_spec`` names them in the ``megatron`` style."""
        out = {}
        for (_, vpp_rank), model in zip(self._chunk_keys(), self.models):
            prefix = f"model{vpp_rank}." if self.vpp else ""
            out.update({prefix + k: v.detach() for k, v in self._local_state(model).items()})
        return out

    def save_hf(self, out_dir: str) -> None:
        """Write a transformers directory (config, safetensors weights, tokenizer files if the
        source had any); every rank must call it, rank 0 writes."""
        from transformers import AutoModelForCausalLM

        state = self.hf_state_dict()
        if dist.get_rank() == 0:
            config = type(self.hf_config).from_dict(self.hf_config.to_dict())
            config.dtype = self.dtype
            model = AutoModelForCausalLM.from_config(config, dtype=self.dtype)
            missing, unexpected = model.load_state_dict(fuse_experts(state, self.arch), strict=False)
            allowed = {"lm_head.weight"} if self.arch.tied_embeddings else set()
            if set(missing) - allowed or unexpected:
                raise RuntimeError(f"export mismatch: missing {missing}, unexpected {unexpected}")
            model.save_pretrained(out_dir)
            for name in _TOKENIZER_FILES:
                if os.path.exists(os.path.join(self.model_dir, name)):
                    shutil.copy(os.path.join(self.model_dir, name), out_dir)
        dist.barrier()

    def param_bytes_local(self) -> int:
        """Bytes of model parameters held by this rank (each tensor counted once)."""
        seen = {id(p): p for m in self.models for p in m.parameters()}
        return sum(p.numel() * p.element_size() for p in seen.values())

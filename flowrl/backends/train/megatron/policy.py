"""The ``megatron`` train backend (:class:`~flowrl.backends.interfaces.TrainEngine`, checkpoint kind
``"sharded"``).

Roles hand engines :class:`~flowrl.data.packed.PackedBatch` objects (flat response tokens with
offsets); :class:`MegatronEngine` takes per-row dicts. This adapter converts both ways and keeps
the roles backend-agnostic: ``forward_logprobs``, ``train_step``, ``all_reduce_sum`` (over the
data-parallel group only: tp/pp peers hold the same rows), ``hf_state_dict`` (complete on global
rank 0), ``reshard_source`` (this rank's shards, for ``flowrl.backends.reshard``), ``save_hf``, ``param_bytes_local``, ``close``.

A frozen engine (the reference policy) is the same engine that never steps its optimizer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from flowrl.backends.interfaces import LossFn
from flowrl.backends.train.optim import AdamWSettings
from flowrl.backends.train.precision import placement
from flowrl.data.packed import PackedBatch
from flowrl.parallel.dtypes import megatron_bf16


def _items(batch: PackedBatch) -> list[dict]:
    """Per-row dicts: prompt/response id lists plus each token field's row slice."""
    p_cu, r_cu = batch.prompt_cu_B1.tolist(), batch.response_cu_B1.tolist()
    prompt, response = batch.prompt_P.tolist(), batch.response_T.tolist()
    items = []
    for i in range(batch.num_rows):
        item = {"prompt_ids": prompt[p_cu[i] : p_cu[i + 1]], "response_ids": response[r_cu[i] : r_cu[i + 1]]}
        for name, values in batch.token_fields.items():
            item[name] = values[r_cu[i] : r_cu[i + 1]]
        items.append(item)
    return items


def _packed(items: list[dict], cu_seqlens_B1: torch.Tensor, field_names: list[str]) -> PackedBatch:
    """Rebuild a PackedBatch from a micro-batch's items (for the role's loss function)."""

    def flat(key: str, dtype: torch.dtype) -> torch.Tensor:
        parts = [torch.as_tensor(it[key], dtype=dtype) for it in items]
        return torch.cat(parts) if parts else torch.empty(0, dtype=dtype)

    prompt_len = torch.tensor([len(it["prompt_ids"]) for it in items], dtype=torch.long)
    return PackedBatch(
        prompt_P=flat("prompt_ids", torch.long),
        prompt_cu_B1=torch.cat([torch.zeros(1, dtype=torch.long), prompt_len.cumsum(0)]),
        response_T=flat("response_ids", torch.long),
        response_cu_B1=cu_seqlens_B1.cpu(),
        token_fields={name: torch.cat([torch.as_tensor(it[name]) for it in items]) for name in field_names},
    )


class MegatronTrainEngine:
    def __init__(
        self,
        model_dir: str,
        *,
        tp: int,
        pp: int,
        dp: int,
        vpp: int | None = None,
        trainable: bool = True,
        dtype: str = "float32",
        device: str = "cpu",
        seed: int = 0,
        use_distributed_optimizer: bool = False,
        offload: dict | None = None,
        ep: int = 1,
        etp: int | None = None,
        moe_aux_loss_coeff: float = 0.0,
        moe_z_loss_coeff: float | None = None,
        **optim: Any,
    ) -> None:
        """``optim``: the optimizer keywords of :class:`~flowrl.backends.train.optim.AdamWSettings`;
        ``device``: the rank's; ``dtype``: ``model.dtype`` (``auto``: bf16 on a GPU, with fp32
        main parameters and gradient reduction; fp32 on the CPU); ``offload``: megatron's
        ``param_offload`` / ``grad_offload`` / ``optimizer_offload`` (verl's names); ``ep`` /
        ``etp`` / ``moe_*_coeff``: a mixture-of-experts model's expert mesh and router losses
        (``actor.megatron.expert_model_parallel_size`` ...)."""
        from flowrl.backends.train.megatron.engine import MegatronEngine

        self.trainable = trainable
        self.device, self.precision = placement(device, dtype, trainable=trainable)
        self.engine = MegatronEngine(
            model_dir, tp=tp, pp=pp, vpp=vpp, dp=dp, **AdamWSettings(**optim).engine_kwargs(),
            use_distributed_optimizer=use_distributed_optimizer and trainable,
            bf16=megatron_bf16(self.precision), seed=seed, device=str(self.device), **(offload or {}),
            ep=ep, etp=etp, moe_aux_loss_coeff=moe_aux_loss_coeff if trainable else 0.0,
            moe_z_loss_coeff=moe_z_loss_coeff if trainable else None,
        )
        self.offloads = any((offload or {}).values())  # the engine moves what is switched on

    def offload_state(self) -> None:
        self.engine.offload_state()

    def onload_state(self, *, optimizer: bool = False) -> None:
        self.engine.onload_state(optimizer=optimizer)

    @property
    def optimizer(self):  # noqa: ANN201 - megatron-core's optimizer (its param_groups carry the rate)
        """The optimizer whose rate the role's schedule sets (None: a frozen engine)."""
        return self.engine.optimizer if self.trainable else None

    def forward_logprobs(
        self, batch: PackedBatch, *, micro_batch_size: int, temperature: float = 1.0, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logps, entropies = self.engine.forward_logprobs(
            _items(batch), micro_batch_size=micro_batch_size, temperature=temperature, with_entropy=with_entropy
        )
        logp_T = torch.from_numpy(np.concatenate(logps)) if logps else torch.empty(0)
        entropy_T = torch.from_numpy(np.concatenate(entropies)) if entropies else None
        return logp_T, entropy_T

    def train_step(
        self, batch: PackedBatch, *, micro_batch_size: int, loss_fn: LossFn, temperature: float = 1.0, with_entropy: bool = True,
        token_stat: str = "entropy",
    ) -> dict[str, float]:
        """``token_stat``: the second per-token tensor ``loss_fn`` gets (``entropy``, or SFT label
        smoothing's ``uniform_nll``; ``megatron/vocab_parallel.py``)."""
        if not self.trainable:
            raise RuntimeError("train_step on a frozen (reference) engine")
        names = list(batch.token_fields)

        def megatron_loss(logp_T, entropy_T, items, cu_seqlens_B1):  # noqa: ANN001, ANN202
            # the loss is computed on the host, where the role's token fields are (as dp's), and
            # goes back to the device for megatron's backward (no copy on the CPU)
            entropy_T = entropy_T.cpu() if with_entropy and entropy_T is not None else None
            loss, stats = loss_fn(logp_T.cpu(), entropy_T, _packed(items, cu_seqlens_B1, names))
            return loss.to(logp_T.device), stats

        return self.engine.train_step(_items(batch), micro_batch_size=micro_batch_size, loss_fn=megatron_loss,
                                      temperature=temperature, token_stat=token_stat)

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        from megatron.core import parallel_state as ps

        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=ps.get_data_parallel_group())
        return t.tolist()

    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        return self.engine.hf_state_dict()

    def reshard_source(self) -> dict[str, torch.Tensor]:
        return self.engine.reshard_source()

    def grad_state_dict(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError("grad_state_dict: the megatron backend keeps gradients in its DDP buffers; "
                                  "use actor.strategy=dp for gradient checks")

    def save_hf(self, directory: str) -> None:
        self.engine.save_hf(directory)

    def save_checkpoint_sharded(self, path: str, *, step: int, extra: dict | None = None) -> dict | None:
        """Every rank: write this rank's chunks of checkpoint ``path`` (``megatron/checkpoint.py``)."""
        from flowrl.backends.train.megatron.checkpoint import save_sharded

        return save_sharded(self.engine, path, step=step, extra=extra)

    def load_checkpoint_sharded(self, path: str) -> int:
        """Every rank: read only this rank's chunks of checkpoint ``path`` (saved under any layout)."""
        from flowrl.backends.train.megatron.checkpoint import load_sharded

        return load_sharded(self.engine, path)

    def param_bytes_local(self) -> int:
        return self.engine.param_bytes_local()

    def close(self) -> None:
        self.engine.close()

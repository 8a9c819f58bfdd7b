"""MegatronValueEngine: the PPO critic's value model on megatron-core (dp x tp x pp).

The same GPTModel backbone as :class:`~flowrl.backends.train.megatron.engine.MegatronEngine`
(embedding, decoder, final RMSNorm), with the vocabulary output layer of the last pipeline stage
replaced by a plain ``hidden -> 1`` linear head (:class:`ValueHead`, replicated on the TP ranks,
not vocab-parallel). It mirrors the ``dp`` critic (``flowrl.backends.train.dp_value``):
``AutoModelForTokenClassification(num_labels=1)`` of the same directory; each rank reads only its
shard of the backbone from the safetensors files, and a new ``score`` head is
``value_head.new_head`` of the same seed as dp's and FSDP's (no whole-model load), and
``score.weight`` / ``score.bias`` map to ``output_layer.weight`` / ``output_layer.bias`` exactly,
both ways (checkpoints too: :meth:`MegatronValueEngine.shard_spec`).

The value of response token ``t`` is read where the policy reads its log-prob (``index_T`` of a
micro-batch: the position that predicts it), the ``pos - 1`` convention of the dp critic and verl.
The train step is the policy engine's schedule (``MegatronEngine._train_schedule``) with a loss
over values instead of log-probs, so loss scaling, DDP reduction, clipping and stats are the same.

Shapes: B = micro-batch rows, S = padded sequence length, H = hidden size, T = response tokens.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from flowrl.backends.train.megatron.batching import MicroBatch
from flowrl.backends.train.megatron.convert import chunk_role, hf_to_megatron, megatron_to_hf
from flowrl.backends.train.megatron.engine import MegatronEngine
from flowrl.backends.train.megatron.model import build_gpt_model
from flowrl.backends.train.optim import AdamWSettings
from flowrl.backends.train.precision import placement
from flowrl.parallel.dtypes import megatron_bf16

log = logging.getLogger(__name__)

ValueLossFn = Callable[[torch.Tensor, list, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]
HEAD_PREFIX = "output_layer."  # the head sits where GPTModel calls its output layer
HF_HEAD_PREFIX = "score."  # AutoModelForTokenClassification's head


class ValueHead(torch.nn.Linear):
    """``hidden -> 1`` with GPTModel's output-layer call signature (``(output, bias)``)."""

    def __init__(self, hidden_size: int, *, bias: bool, dtype: torch.dtype):
        super().__init__(hidden_size, 1, bias=bias, dtype=dtype)

    def forward(self, hidden_SBH: torch.Tensor, weight: Any = None,  # noqa: ARG002 (GPTModel's call)
                runtime_gather_output: Any = None) -> tuple[torch.Tensor, None]:
        return super().forward(hidden_SBH), None


def _config_copy(hf_config: Any, **changes: Any) -> Any:
    config = type(hf_config).from_dict(hf_config.to_dict())
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def load_hf_value_model(model_dir: str, *, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """``AutoModelForTokenClassification(num_labels=1)`` exactly as the dp critic builds it (a new
    head is ``value_head.new_head`` of ``seed``)."""
    from transformers import AutoModelForTokenClassification

    from flowrl.backends.train.dp_value import TorchDPValueEngine
    from flowrl.backends.train.value_head import load_classifier

    return load_classifier(AutoModelForTokenClassification, model_dir, TorchDPValueEngine._classifier_config(model_dir),
                           dtype=dtype, seed=seed)


def value_shard_spec(hf_config: Any, *, tp: int, pp: int, dp: int, head_bias: bool,
                     make_vocab_size_divisible_by: int = 128) -> Any:
    """:meth:`MegatronValueEngine.shard_spec` from the facts it needs (no engine)."""
    import dataclasses

    from flowrl.parallel.mesh import ParallelDims
    from flowrl.parallel.shard_spec import ModelShape, Piece, RankShard, shard_spec

    model = dataclasses.replace(ModelShape.from_hf_config(hf_config), tied_embeddings=True)
    base = shard_spec(model, ParallelDims(dp=dp, tp=tp, pp=pp), style="megatron",
                      make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    head = {HEAD_PREFIX + "weight": (HF_HEAD_PREFIX + "weight", (1, model.hidden_size))}
    if head_bias:
        head[HEAD_PREFIX + "bias"] = (HF_HEAD_PREFIX + "bias", (1,))
    shards = {}
    for key, shard in base.shards.items():
        if shard.pp_rank == pp - 1:  # the head replaces the tied copy of the embedding (pp > 1)
            tensors = {n: t for n, t in shard.tensors.items() if n not in head}
            pieces = [p for p in shard.pieces if p.local not in head]
            for local, (param, shape) in head.items():
                tensors[local] = shape
                pieces.append(Piece(param, 0, 0, 1, local, 0))
            shard = dataclasses.replace(shard, tensors=tensors, pieces=tuple(pieces))
        shards[key] = shard
    params = {**base.params, **{param: shape for param, shape in head.values()}}
    return dataclasses.replace(base, params=params, split_dim={**base.split_dim, **{p: 0 for p, _ in head.values()}},
                               shards=shards)


class MegatronValueEngine(MegatronEngine):
    """One rank's share of a megatron-core value model: forward values, value-loss train steps,
    HF (token-classification) export."""

    def __init__(self, model_dir: str, *, seed: int = 0, **kwargs: Any):
        self._seed = seed
        super().__init__(model_dir, seed=seed, **kwargs)

    def _load_hf_model(self) -> torch.nn.Module:
        """The transformers model whose backbone and ``score`` head this engine holds (fp32)."""
        return load_hf_value_model(self.model_dir, dtype=torch.float32, seed=self._seed)

    # ----------------------------------------------------------------------------- construction
    head_bias = True
    """The head has a bias (token classification's ``score``; the reward model's has none)."""

    def _build_and_load(self) -> list[torch.nn.Module]:
        """This rank's chunks: the backbone's shard read slice by slice from the causal LM's
        safetensors (as the policy engine's), the head on the last stage: the checkpoint's own, or
        ``value_head.new_head`` of the seed (the dp engine's numbers, without loading the model
        whole); else (no safetensors, other tensor names) from a whole ``from_pretrained`` load."""
        from flowrl.backends.train.tensor_source import safetensors_source
        from flowrl.backends.train.value_head import head_from_checkpoint, new_head

        values = head_from_checkpoint(self.model_dir) or new_head(self.hf_config, seed=self._seed,
                                                                  bias=self.head_bias)
        head = {"weight": values["weight"], **({"bias": values.get("bias", torch.zeros(1))} if self.head_bias else {})}
        with safetensors_source(self.model_dir) as source:
            try:
                if source is not None:
                    models = self._build_value_chunks(source, head)
                    self.checkpoint_bytes_read = source.bytes_read
                    return models
            except KeyError as missing:
                log.info("megatron value model: %s not in %s's safetensors by its HF name; loading the model whole",
                         missing, self.model_dir)
        with torch.random.fork_rng(devices=[]):
            hf_model = self._load_hf_model()
        hf_state = hf_model.state_dict()
        head = {k[len(HF_HEAD_PREFIX):]: v for k, v in hf_state.items() if k.startswith(HF_HEAD_PREFIX)}
        try:
            return self._build_value_chunks(hf_state, head)
        finally:
            del hf_model, hf_state

    def _build_value_chunks(self, hf_state: Any, head: dict[str, torch.Tensor]) -> list[torch.nn.Module]:
        if set(head) - {"weight", "bias"} or "weight" not in head or head["weight"].shape[0] != 1:
            raise RuntimeError(f"unexpected value head in {self.model_dir}: "
                               f"{ {k: tuple(v.shape) for k, v in head.items()} }")
        # The backbone converts as a tied model (no lm_head needed); the chunk is built untied so
        # that the last stage owns its output layer, which becomes the value head.
        self.head_bias = "bias" in head
        tied_cfg = _config_copy(self.hf_config, tie_word_embeddings=True)
        untied_cfg = _config_copy(self.hf_config, tie_word_embeddings=False)
        models = []
        for pp_rank, vpp_rank in self._chunk_keys():
            pre, post = chunk_role(pp_rank=pp_rank, pp=self.pp, vpp_rank=vpp_rank, vpp=self.vpp)
            model = build_gpt_model(untied_cfg, config=self.config, pre_process=pre,
                                    post_process=post, vp_stage=vpp_rank,
                                    make_vocab_size_divisible_by=self.make_vocab_size_divisible_by)
            shard = hf_to_megatron(
                hf_state, tied_cfg, tp_rank=ps.get_tensor_model_parallel_rank(), tp=self.tp,
                pp_rank=pp_rank, pp=self.pp, vpp_rank=vpp_rank, vpp=self.vpp,
                make_vocab_size_divisible_by=self.make_vocab_size_divisible_by)
            shard = {k: v for k, v in shard.items() if not k.startswith(HEAD_PREFIX)}
            if post:
                model.output_layer = ValueHead(self.arch.hidden_size, bias="bias" in head,
                                               dtype=self.dtype)
                shard.update({HEAD_PREFIX + k: v for k, v in head.items()})
            self._load_shard(model, shard)
            del shard
            models.append(model.to(self.device))
        return models

    def shard_spec(self) -> Any:
        """The megatron-style shard spec of this value model (``megatron/checkpoint.py`` saves and
        loads by it): the backbone's as a tied model (no vocabulary output layer), with the head
        whole on the last stage, ``output_layer.weight`` / ``.bias`` <-> HF ``score.weight`` /
        ``.bias`` (the names of the dp critic's and reward model's checkpoints, so either side of a
        save / load may be dp, fsdp or megatron at any layout)."""
        if self.vpp:
            raise ValueError(f"virtual_pipeline_model_parallel_size={self.vpp}: the megatron value model has no "
                             "interleaved pipeline; set it to 1")
        return value_shard_spec(self.hf_config, tp=self.tp, pp=self.pp, dp=self.dp, head_bias=self.head_bias,
                                make_vocab_size_divisible_by=self.make_vocab_size_divisible_by)

    # ----------------------------------------------------------------------------- public API
    @staticmethod
    def _values(mb: MicroBatch, values_BS1: torch.Tensor) -> torch.Tensor:
        return values_BS1.reshape(-1).index_select(0, mb.index_T).float()

    @torch.no_grad()
    def forward_values(self, batch: list[dict], *, micro_batch_size: int) -> list[np.ndarray]:
        """Each item's per-response-token values (float32); every tp/pp rank of a dp group passes
        the same ``batch`` and gets the result."""
        def loss_func(mb, values_BS1):
            values_T = self._values(mb, values_BS1)
            return values_T.new_zeros(()), torch.tensor(mb.num_tokens, dtype=torch.int), {
                "mb": mb.index, "values": values_T}

        for chunk in self.chunks:
            chunk.eval()
        store = self._run_schedule(batch, micro_batch_size=micro_batch_size, forward_only=True,
                                   loss_func=loss_func)
        lengths = [len(item["response_ids"]) for item in batch]
        values_T = torch.zeros(sum(lengths), dtype=torch.float32, device=self.device)
        if store:  # last pipeline stage
            values_T.copy_(torch.cat([out["values"] for out in store]))
        values_T = self._from_last_stage(values_T).cpu().numpy()
        return np.split(values_T, np.cumsum(lengths)[:-1])

    def train_step_values(self, batch: list[dict], *, micro_batch_size: int,
                          loss_fn: ValueLossFn) -> dict[str, float]:
        """One optimizer step; ``loss_fn(values_T, items, cu_seqlens_B1)`` per micro-batch, its
        losses summed over micro-batches and dp ranks (normalise by global counts)."""
        def mb_loss(mb, values_BS1):
            return loss_fn(self._values(mb, values_BS1), mb.items, mb.cu_seqlens_B1)

        return self._train_schedule(batch, micro_batch_size=micro_batch_size, mb_loss=mb_loss)

    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full ``AutoModelForTokenClassification`` state (``model.*`` and ``score.*``, on
        CPU), complete on global rank 0, None elsewhere. Every rank must call it."""
        merged = self.gathered_shards()
        if merged is None:
            return None
        head = {}
        for (tp_rank, _, _), shard in sorted(merged.items(), key=lambda kv: str(kv[0])):
            for k in [k for k in shard if k.startswith(HEAD_PREFIX)]:
                value = shard.pop(k)
                if tp_rank == 0:
                    head[HF_HEAD_PREFIX + k[len(HEAD_PREFIX):]] = value
        tied_cfg = _config_copy(self.hf_config, tie_word_embeddings=True)
        out = megatron_to_hf(merged, tied_cfg, tp=self.tp, pp=self.pp, vpp=self.vpp)
        return {**out, **head}

    def save_hf(self, out_dir: str) -> None:
        """Write a transformers token-classification directory (rank 0; every rank calls it)."""
        state = self.hf_state_dict()
        if dist.get_rank() == 0:
            with torch.random.fork_rng(devices=[]):
                model = self._load_hf_model()
            model.load_state_dict(state, strict=True)
            model.to(self.dtype).save_pretrained(out_dir)
        dist.barrier()


class MegatronValueTrainEngine:
    """:class:`MegatronValueEngine` behind ``TorchDPValueEngine``'s interface (PackedBatch in,
    flat ``_T`` tensors out): ``forward_values``, ``train_step_values``, ``all_reduce_sum`` (over
    the data-parallel group), ``hf_state_dict``, ``save_hf``, ``close``."""

    engine_class: type[MegatronValueEngine] | None = None
    """The engine behind it (None: :class:`MegatronValueEngine`; ``megatron/reward.py``: the reward model's)."""

    def __init__(self, model_dir: str, *, tp: int, pp: int, dp: int, vpp: int | None = None,
                 dtype: str = "float32", device: str = "cpu", seed: int = 0, use_distributed_optimizer: bool = False,
                 **optim: Any):
        """``optim``: the optimizer keywords of :class:`~flowrl.backends.train.optim.AdamWSettings`;
        ``device`` and ``dtype`` as :class:`~flowrl.backends.train.megatron.policy.MegatronTrainEngine`'s."""
        self.device, self.precision = placement(device, dtype)
        self.engine = (self.engine_class or MegatronValueEngine)(
            model_dir, tp=tp, pp=pp, vpp=vpp, dp=dp, **AdamWSettings(**optim).engine_kwargs(),
            use_distributed_optimizer=use_distributed_optimizer,
            bf16=megatron_bf16(self.precision), seed=seed, device=str(self.device))

    @property
    def optimizer(self):  # noqa: ANN201 - megatron-core's optimizer (its param_groups carry the rate)
        """The optimizer whose rate the critic's schedule sets."""
        return self.engine.optimizer

    def forward_values(self, batch, *, micro_batch_size: int) -> torch.Tensor:
        from flowrl.backends.train.megatron.policy import _items

        values = self.engine.forward_values(_items(batch), micro_batch_size=micro_batch_size)
        return torch.from_numpy(np.concatenate(values)) if values else torch.empty(0)

    def train_step_values(self, batch, *, micro_batch_size: int, loss_fn) -> dict[str, float]:
        """``loss_fn(values_T, mb)`` with ``mb`` a PackedBatch of the micro-batch's rows (as the
        dp critic's); stats are means over micro-batches and dp ranks, plus grad_norm and lr."""
        from flowrl.backends.train.megatron.policy import _items, _packed

        names = list(batch.token_fields)

        def megatron_loss(values_T, items, cu_seqlens_B1):  # noqa: ANN001, ANN202
            loss, stats = loss_fn(values_T.cpu(), _packed(items, cu_seqlens_B1, names))  # on the host, as dp's
            return loss.to(values_T.device), stats

        stats = self.engine.train_step_values(_items(batch), micro_batch_size=micro_batch_size,
                                              loss_fn=megatron_loss)
        stats.pop("loss", None)
        return stats

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=ps.get_data_parallel_group())
        return t.tolist()

    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        return self.engine.hf_state_dict()

    def save_hf(self, directory: str) -> None:
        self.engine.save_hf(directory)

    def save_checkpoint_sharded(self, path: str, *, step: int, extra: dict | None = None) -> dict | None:
        """Every rank: write this rank's chunks of checkpoint ``path`` (the head included)."""
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

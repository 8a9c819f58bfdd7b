"""What roles may call on an engine: the Protocols every backend implements, and the value types
they share (``SamplingParams``, the dtype table).

Three kinds of engines, each registered by name with its spec in :mod:`flowrl.catalog.backends`:

* :class:`TrainEngine` (``actor.strategy`` / ``ref.strategy``: ``dp``, ``megatron``): log-probs of
  packed responses, PPO-style optimizer steps with a caller's loss, the weights for a reshard, an
  HF export. Checkpoints come in two kinds, named by the backend spec's ``checkpoint`` field:
  ``"full"`` engines implement :class:`FullCheckpointEngine` (the role writes the full state),
  ``"sharded"`` ones :class:`ShardedCheckpointEngine` (every rank writes its own chunks).
* :class:`ValueEngine` (``critic.strategy``: ``dp``, ``megatron``): the PPO critic's values and
  value-loss steps.
* :class:`GenerateEngine` (``rollout.name``: ``hf``, ``vllm``): sampling, teacher-forced
  log-probs, weight loads, colocated sleep / wake-up. A reshard writes into it either in place
  (:class:`ReshardTarget`, spec field ``reshard=ReshardMode.IN_PLACE``) or through staging tensors
  assembled and loaded with ``load_hf_state`` (``ReshardMode.STAGED``).

Optional abilities, which roles test with ``isinstance`` before using them, are the small
runtime-checkable Protocols at the end (:class:`HasGenerationModule`, :class:`ReportsStats`, ...).

Nothing here imports torch at module level; :func:`torch_dtype` imports it when called.

Shape letters: T flat response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, runtime_checkable

from flowrl.config.sections import DTYPES  # the model.dtype names every engine accepts

if TYPE_CHECKING:
    import torch

    from flowrl.data.packed import PackedBatch, Padded
    from flowrl.models.lora import LoraSpec

__all__ = [
    "DTYPES",
    "ComputesReferenceLogprobs",
    "HasGenerationModule",
    "HasLora",
    "HasModel",
    "HasOptimizer",
    "OffloadsState",
    "ReportsStats",
    "FullCheckpointEngine",
    "GenerateEngine",
    "ReshardSource",
    "ReshardTarget",
    "SamplingParams",
    "ShardedCheckpointEngine",
    "TrainEngine",
    "ValueEngine",
    "model_kwargs",
    "torch_dtype",
]



def torch_dtype(name: str) -> "torch.dtype":
    """The torch dtype of a ``model.dtype`` name (``"float32"``, ``"bfloat16"``)."""
    import torch

    table = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"dtype {name!r} is not supported; use one of {', '.join(DTYPES)}")
    return table[name]


def model_kwargs(inputs: "Padded", device: "torch.device", attn_implementation: str = "sdpa") -> dict[str, "torch.Tensor"]:
    """A transformers model's keyword inputs for padded rows (attention mask), packed lines
    (per-sequence ``position_ids``, no mask: transformers builds the block-causal mask) or
    shared-prompt lines (a ready 4D mask, which transformers passes through as-is: a bool
    ``[B, 1, L, L]`` for ``sdpa``, an additive float one for ``eager``; ``attn_implementation``
    is the model's ``config._attn_implementation``)."""
    # no KV cache: training forwards never reuse it, and transformers reads packed position ids only without one
    kwargs: dict = {"input_ids": inputs.input_ids_BL.to(device), "use_cache": False}
    if inputs.attention_mask_BL is not None:
        kwargs["attention_mask"] = inputs.attention_mask_BL.to(device)
    if inputs.position_ids_BL is not None:
        kwargs["position_ids"] = inputs.position_ids_BL.to(device)
    if inputs.block_mask_BLL is not None:
        kwargs["attention_mask"] = block_attention_mask(inputs.block_mask_BLL, attn_implementation).to(device)
    return kwargs


def block_attention_mask(mask_BLL: "torch.Tensor", attn_implementation: str) -> "torch.Tensor":
    """The 4D mask an attention implementation takes for a bool ``mask_BLL`` (True: attend)."""
    import torch

    if attn_implementation == "sdpa":
        return mask_BLL[:, None]
    if attn_implementation == "eager":  # added to the scores (float32: promotes bf16 scores before softmax)
        additive = torch.zeros(mask_BLL.shape, dtype=torch.float32)
        return additive.masked_fill_(~mask_BLL, torch.finfo(torch.float32).min)[:, None]
    raise ValueError(f"use_prefix_grouper=true (actor, ref or critic) needs attn_implementation sdpa or eager, "
                     f"the model has {attn_implementation!r}; fix: load it with sdpa, or set use_prefix_grouper=false")


def eos_token_ids(model_dir: str) -> list[int]:
    """The ids generation stops at: the generation config's EOS, else the model config's."""
    from transformers import AutoConfig, GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        eos = None
    if eos is None:
        eos = AutoConfig.from_pretrained(model_dir).eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


@dataclass(frozen=True)
class SamplingParams:
    """How a generation engine samples: ``n`` responses per prompt, at most ``max_new_tokens``
    each, from ``logits / temperature`` truncated to ``top_k`` (-1: off) and ``top_p``;
    ``temperature == 0`` is greedy."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 16

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_section(cls, section: Any, *, max_new_tokens: int, greedy: bool = False) -> "SamplingParams":
        """The one builder from a config section with ``n``, ``temperature``, ``top_p``, ``top_k``
        (``rollout``, ``rollout.val_kwargs``); ``greedy``: ``n`` greedy responses instead. Derived
        parameters (one sample, a shorter budget) are ``dataclasses.replace`` of these."""
        if greedy:
            return cls(n=section.n, temperature=0.0, max_new_tokens=max_new_tokens)
        return cls(n=section.n, temperature=section.temperature, top_p=section.top_p, top_k=section.top_k,
                   max_new_tokens=max_new_tokens)


# ----------------------------------------------------------------------------- reshard endpoints
ReshardSource = Mapping[str, "torch.Tensor"]
"""A source rank's tensors for ``flowrl.backends.reshard.run_rank(src=...)``: its training shard
by the local names of the source spec (``hf`` style: HF names; ``megatron``: its TP/PP shard)."""

ReshardTarget = Mapping[str, "torch.Tensor"]
"""A destination rank's tensors, overwritten in place by ``run_rank(dst=...)``: the live
generation weights by the destination spec's local names (``hf`` style: HF names, tp = 1)."""

LossFn = Callable[["torch.Tensor", "torch.Tensor | None", "PackedBatch"], tuple["torch.Tensor", dict]]
"""``loss_fn(logp_T, entropy_T or None, micro_batch) -> (loss, stats)``: the loss already
normalised by the global denominator (summed over micro-batches and ranks)."""

ValueLossFn = Callable[["torch.Tensor", "PackedBatch"], tuple["torch.Tensor", dict]]
"""``loss_fn(values_T, micro_batch) -> (loss, stats)``, normalised as :data:`LossFn`."""


# ----------------------------------------------------------------------------- engines
@runtime_checkable
class TrainEngine(Protocol):
    """One rank of a policy (trainable) or reference (frozen, ``trainable=False``) model.

    Built as ``cls(model_dir, *, trainable, dtype, lr, weight_decay, betas, eps, grad_clip, seed,
    **engine_kwargs)`` (the frozen reference gets only ``trainable`` and ``dtype``), the extra
    keyword arguments from the backend spec's ``engine_kwargs``."""

    optimizer: Any
    """The optimizer (its ``param_groups`` carry the rate the role schedules); None when frozen."""

    def forward_logprobs(self, batch: "PackedBatch", *, micro_batch_size: int, temperature: float = 1.0,
                         with_entropy: bool = False) -> tuple["torch.Tensor", "torch.Tensor | None"]:
        """Response-token log-probs (and entropies) of ``logits / temperature``, flat ``_T``."""

    def train_step(self, batch: "PackedBatch", *, micro_batch_size: int, loss_fn: LossFn,
                   temperature: float = 1.0, with_entropy: bool = True) -> dict[str, float]:
        """One optimizer step over this rank's share; token-weighted stats plus ``grad_norm``, ``lr``."""

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Small host values summed over the data-parallel group."""

    def hf_state_dict(self) -> "dict[str, torch.Tensor] | None":
        """The full HF-named state on rank 0 (None elsewhere on sharded backends); every rank calls it."""

    def reshard_source(self) -> ReshardSource:
        """This rank's live parameter shards for a reshard (the backend's ``shard_style``)."""

    def grad_state_dict(self) -> "dict[str, torch.Tensor]":
        """The reduced gradients of the last step by HF name (for checks)."""

    def save_hf(self, directory: str) -> None:
        """Write a transformers directory (rank 0 writes; sharded backends need every rank)."""

    def param_bytes_local(self) -> int:
        """Bytes of the parameters this rank holds."""

    def close(self) -> None:
        """Release what the engine holds (process groups of its own, devices); may do nothing."""


class FullCheckpointEngine(Protocol):
    """Checkpoint kind ``"full"``: every rank holds the full state."""

    def checkpoint_state(self) -> dict[str, Any]:
        """``{"params": {name: tensor}, "optim": {state: {name: tensor}}, "optim_step": int}``."""

    def load_checkpoint(self, params: dict, optim: dict | None = None, optim_step: int = 0) -> None:
        """Restore what :meth:`checkpoint_state` returned, exactly."""


class ShardedCheckpointEngine(Protocol):
    """Checkpoint kind ``"sharded"``: each rank writes and reads only its own chunks."""

    def save_checkpoint_sharded(self, path: str, *, step: int, extra: dict | None = None) -> dict | None:
        """Every rank: write this rank's chunks; rank 0 commits, returns ``{"path", "optim_step"}``."""

    def load_checkpoint_sharded(self, path: str) -> int:
        """Every rank: read this rank's chunks of a checkpoint saved under any layout; the optimizer step."""


@runtime_checkable
class ValueEngine(Protocol):
    """One rank of a value model (the PPO critic), built as ``cls(model_dir, *, dtype, lr,
    weight_decay, betas, eps, grad_clip, seed, **engine_kwargs)``."""

    optimizer: Any
    """The optimizer (its ``param_groups`` carry the rate the role schedules)."""

    def forward_values(self, batch: "PackedBatch", *, micro_batch_size: int) -> "torch.Tensor":
        """The value of every response token, flat ``_T`` (float32)."""

    def train_step_values(self, batch: "PackedBatch", *, micro_batch_size: int,
                          loss_fn: ValueLossFn) -> dict[str, float]:
        """One optimizer step; token-weighted stats plus ``grad_norm`` and ``lr``."""

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Small host values summed over the data-parallel group."""

    def hf_state_dict(self) -> "dict[str, torch.Tensor] | None":
        """The full HF-named state (token-classification head as ``score.*``) on rank 0."""

    def save_hf(self, directory: str) -> None:
        """Write a transformers token-classification directory."""

    def close(self) -> None:
        """Release what the engine holds; may do nothing."""


@runtime_checkable
class GenerateEngine(Protocol):
    """One generation engine (a replica's tp rank 0 holds it), built as ``cls(model_dir, *,
    dtype, **engine_kwargs)``."""

    def generate(self, prompts: list[list[int]], params: SamplingParams, *, seed: int = 0,
                 micro_batch_size: int = 256) -> tuple[list[list[int]], list[list[float]]]:
        """``params.n`` responses per prompt (prompt-major) and each sampled token's log-prob."""

    def logprobs(self, prompts: list[list[int]], responses: list[list[int]], *,
                 temperature: float = 1.0) -> list[list[float]]:
        """Teacher-forced log-probs of each response token under ``logits / temperature``."""

    def load_hf_state(self, state: "dict[str, torch.Tensor]") -> None:
        """Take a full HF-named state (the weight sync's path for staged reshards and restores)."""

    def reshard_target(self) -> ReshardTarget:
        """The live weights a reshard overwrites in place (``reshard="in_place"`` backends); staged
        backends raise NotImplementedError."""

    def sleep(self) -> None:
        """Colocated mode: release the KV cache and park the weights; may do nothing."""

    def wake_up(self) -> None:
        """Restore what :meth:`sleep` released; may do nothing."""

    def close(self) -> None:
        """Stop the engine (its processes, if any); may do nothing."""


# ----------------------------------------------------------------------------- optional abilities
@runtime_checkable
class HasModel(Protocol):
    """An engine whose live module(s) a role may read (memory accounting, LoRA adapters)."""

    model: Any
    """A ``torch.nn.Module``, or a list of them (megatron's virtual pipeline chunks)."""


@runtime_checkable
class HasOptimizer(Protocol):
    """A trainable engine: ``optimizer`` (its ``param_groups`` carry the learning rate the role
    schedules; None for a frozen engine)."""

    optimizer: Any


@runtime_checkable
class HasLora(Protocol):
    """An engine that may train LoRA adapters: ``lora`` its settings, None when every weight trains."""

    lora: "LoraSpec | None"


@runtime_checkable
class ComputesReferenceLogprobs(Protocol):
    """A policy engine that computes the reference log-probs itself (LoRA: the base model with
    the adapters disabled, no reference group)."""

    def reference_logprobs(self, batch: "PackedBatch", *, micro_batch_size: int,
                           temperature: float = 1.0) -> "torch.Tensor":
        """Response-token log-probs of the reference policy, flat ``_T``."""


@runtime_checkable
class HasGenerationModule(Protocol):
    """A train engine whose live HF module an in-process generation engine may generate with
    (the hybrid placement's shared layout)."""

    def generation_module(self) -> "torch.nn.Module | None":
        """The full HF module, or None when this rank does not hold one."""


@runtime_checkable
class ReportsStats(Protocol):
    """A generation engine that counts its last decode: ``last_stats`` (``slots``: positions
    computed, ``tokens``: real tokens fed), None before the first ``generate``."""

    last_stats: Any


@runtime_checkable
class OffloadsState(Protocol):
    """A train engine that moves its state to host memory between its phases (FSDP's
    ``fsdp_config.param_offload`` / ``optimizer_offload``, megatron's offload): the role calls
    ``onload_state`` before each phase and ``offload_state`` after it
    (``flowrl.roles.memory.Residency``). ``offloads``: whether any switch is on."""

    offloads: bool

    def offload_state(self) -> None:
        """The switched-on state to the host (nothing moves on the CPU)."""

    def onload_state(self, *, optimizer: bool = False) -> None:
        """The parameters back on the device; with ``optimizer``, the optimizer state too."""

"""Model FLOPs utilisation of a training update (``perf/mfu/actor``), as verl reports it.

verl's ``FlopsCounter`` (``verl/utils/flops_counter.py``) counts a decoder's training FLOPs per
sequence of ``s`` tokens as the dense part, ``6 N s`` (forward 2, backward 4 FLOPs per weight and
token; ``N`` the weights of the linear layers, embedding and head), plus causal attention's score
and value products, ``6 s^2 d h L`` (head size ``d``, ``h`` query heads, ``L`` layers), and
divides what an update computed by its seconds and the device's peak dense bf16 rate. flowrl
counts the same way, over the rows a rank trained on (every epoch), so the metric is the rank's
own utilisation; verl's is the same quantity averaged over the ranks.

Pure (numbers in, numbers out): the engine's device name and the model's config come from the
caller. On the CPU, or on a device not in :data:`PEAK_BF16_FLOPS`, there is no peak and so no
metric (never a made-up number).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["PEAK_BF16_FLOPS", "ModelFlops", "UpdateMfu", "mfu", "peak_bf16_flops"]

PEAK_BF16_FLOPS: dict[str, float] = {
    "GB200": 2.5e15,
    "B200": 2.25e15,
    "H100": 989e12,
    "H200": 989e12,
    "H800": 989e12,
    "H20": 148e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362.05e12,
    "L40": 181.05e12,
    "A40": 149.7e12,
    "L20": 119.5e12,
    "MI300X": 1336e12,
}
"""Dense (no sparsity) bf16 peak FLOP/s by a name that appears in ``torch.cuda.get_device_name()``
(the vendors' data sheets, verl's table)."""


def peak_bf16_flops(device_name: str | None) -> float | None:
    """The peak bf16 FLOP/s of a device named ``device_name`` (``NVIDIA H200``, ``NVIDIA
    A100-SXM4-80GB``): the longest key of :data:`PEAK_BF16_FLOPS` it contains (``H200`` before
    ``H20``); None for the CPU (``device_name`` None) or an unknown device."""
    if not device_name:
        return None
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in device_name:
            return PEAK_BF16_FLOPS[key]
    return None


@dataclass(frozen=True)
class ModelFlops:
    """What a decoder-only model computes per token: ``dense_params`` (weights of the linear
    layers, the embedding and the head: ``N``) and the attention coefficient ``head_dim *
    num_heads * num_layers`` (times ``s^2`` per sequence)."""

    dense_params: int
    attention: int

    @classmethod
    def from_hf_config(cls, config: Any) -> "ModelFlops":
        """From a transformers config of a Llama/Qwen2-style decoder (gated MLP: gate, up and
        down projections; GQA: ``num_key_value_heads``)."""
        hidden, layers = config.hidden_size, config.num_hidden_layers
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        mlp = 3 * hidden * config.intermediate_size
        attention_linear = hidden * (2 * heads * head_dim + 2 * kv_heads * head_dim)  # q, o; k, v
        embedding_and_head = 2 * config.vocab_size * hidden
        return cls(dense_params=(mlp + attention_linear) * layers + embedding_and_head,
                   attention=head_dim * heads * layers)

    def train_flops(self, seqlens: Iterable[int]) -> float:
        """Forward and backward FLOPs of training on sequences of ``seqlens`` tokens."""
        lengths = list(seqlens)
        return 6.0 * self.dense_params * sum(lengths) + 6.0 * self.attention * sum(s * s for s in lengths)


def mfu(flops: float, seconds: float, peak_flops: float, *, num_devices: int = 1) -> float:
    """The fraction of ``num_devices`` devices' peak that ``flops`` in ``seconds`` is (a model
    sharded over tp x pp devices computes its rows' FLOPs on all of them)."""
    return flops / max(seconds, 1e-9) / (peak_flops * max(num_devices, 1))


@dataclass(frozen=True)
class UpdateMfu:
    """What a rank needs to report its update's MFU: the model's FLOPs per token, its device's
    peak bf16 rate and how many devices hold one replica of the model (tp x pp; 1 for dp/fsdp)."""

    model: ModelFlops
    peak_flops: float
    num_devices: int = 1

    def of(self, seqlens: Iterable[int], seconds: float, *, epochs: int = 1) -> float:
        """The MFU of training ``epochs`` times on sequences of ``seqlens`` tokens in ``seconds``."""
        return mfu(epochs * self.model.train_flops(seqlens), seconds, self.peak_flops, num_devices=self.num_devices)

"""Mixture-of-experts statistics of a megatron train step, and the scale of its router losses.

Per step (keys as the role prefixes them: ``actor/moe/...``, Megatron-LM's logging names):

- ``moe/load_balancing_loss``: megatron's switch load-balancing loss (``aux_loss``; only when
  ``moe_aux_loss_coeff`` > 0, as Megatron logs it), per layer the mean over the step's
  micro-batches on every data-parallel rank, then the mean over layers; ``moe/z_loss`` likewise
  (only when ``moe_z_loss_coeff`` is set).
- ``moe/expert_load_imbalance``: the largest over layers of max/mean tokens per expert (1.0: every
  expert got the same number of tokens), and ``moe/expert_load_imbalance/layer_{i}`` per layer,
  counted over the step's real (not padding) tokens on every rank.
- ``moe/dropped_tokens``: token-to-expert assignments the router dropped (``top_k`` per real
  token minus those dispatched); 0 with dropless routing (``moe_expert_capacity_factor=None``).

Router losses. The engine passes megatron its padding mask (:meth:`MoeStats.padding_mask`), so the
load-balancing and z-losses of a micro-batch are over its real tokens only (padding rows and the
positions after a row's end stay out, as transformers' ``attention_mask`` keeps them out). Megatron
attaches ``coeff * loss * valid_tokens`` of each micro-batch to the router's gradient (router.py
``attach_and_log_load_balancing_loss`` / ``apply_z_loss`` with ``calculate_per_token_loss``) and
expects ``finalize_model_grads`` to divide by the step's tokens; flowrl's engine does not (its
policy loss is normalised by global token counts already). So :meth:`MoeStats.begin` sets the
coefficients the routers read to ``coeff / valid_tokens_of_the_step`` (summed over data-parallel
ranks): each router loss enters the gradient as ``coeff`` times its token-weighted mean over the
step's micro-batches, Megatron-LM's per-token normalisation. With sequence parallelism (MoE at
tp > 1) each tp rank's share follows megatron's own split of the losses over tp ranks.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.transformer.moe import moe_utils
from megatron.core.transformer.moe.router import TopKRouter

LOAD_BALANCING_LOSS = "moe/load_balancing_loss"
Z_LOSS = "moe/z_loss"
EXPERT_LOAD_IMBALANCE = "moe/expert_load_imbalance"
DROPPED_TOKENS = "moe/dropped_tokens"
_TRACKED = {"load_balancing_loss": LOAD_BALANCING_LOSS, "z_loss": Z_LOSS}


def layer_imbalance_key(layer: int) -> str:
    """The per-layer load-imbalance key of (0-based, global) layer ``layer``."""
    return f"{EXPERT_LOAD_IMBALANCE}/layer_{layer}"


class MoeStats:
    """Counts routed tokens per layer and expert through forward hooks on this rank's routers."""

    def __init__(self, config: Any, models: Sequence[torch.nn.Module]):
        self.config = config
        self.aux_loss_coeff = float(config.moe_aux_loss_coeff or 0.0)
        self.z_loss_coeff = config.moe_z_loss_coeff
        self.num_layers, self.num_experts = config.num_layers, config.num_moe_experts
        self.topk = config.moe_router_topk
        self.routers = [m for model in models for m in model.modules() if isinstance(m, TopKRouter)]
        self._hooks = [r.register_forward_hook(self._record) for r in self.routers]
        self._recording = False
        self._valid_N: torch.Tensor | None = None
        self.num_micro_batches = 1
        self._reset()

    def _reset(self) -> None:
        self.tokens_LE = torch.zeros(self.num_layers, self.num_experts, dtype=torch.float64)
        self.dropped = 0.0

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # ------------------------------------------------------------------ during a schedule
    def begin(self, micro_batches: Sequence[Any], *, seq_len: int, training: bool) -> None:
        """Before a schedule: a train step records and scales the router losses; a forward does not."""
        self._recording = training
        if not training:
            return
        self._reset()
        moe_utils.clear_aux_losses_tracker()
        valid = sum(len(it["prompt_ids"]) + len(it["response_ids"]) - 1 for mb in micro_batches for it in mb.items)
        count = torch.tensor([float(len(micro_batches)), float(valid)], dtype=torch.float64)
        dist.all_reduce(count, group=ps.get_data_parallel_group())
        self.num_micro_batches = int(count[0])
        scale = 1.0 / float(count[1])
        self.config.moe_aux_loss_coeff = self.aux_loss_coeff * scale
        if self.z_loss_coeff is not None:
            self.config.moe_z_loss_coeff = self.z_loss_coeff * scale

    def set_micro_batch(self, mb: Any) -> None:
        """The micro-batch the next forward runs: which router rows are real tokens."""
        if not self._recording:
            return
        B, S = mb.tokens_BS.shape
        lengths_B = torch.tensor([len(it["prompt_ids"]) + len(it["response_ids"]) - 1 for it in mb.items]
                                 + [0] * (B - len(mb.items)))
        valid_SB = torch.arange(S)[:, None] < lengths_B[None, :]  # megatron's tokens are [s, b]
        if self.config.sequence_parallel:  # this tp rank's slice of the sequence
            tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
            valid_SB = valid_SB.chunk(tp)[rank]
        self._valid_N = valid_SB.reshape(-1)

    @staticmethod
    def padding_mask(mb: Any, *, first_stage: bool, sequence_parallel: bool) -> torch.Tensor:
        """megatron's MoE padding mask of a micro-batch, ``[b, s]``, True at padding (gpt_model.py
        forward: "True = padding (exclude)"). GPTModel splits it over the tp ranks' sequence slices
        only on the first pipeline stage (gpt_model.py:314); later stages get their slice here."""
        B, S = mb.tokens_BS.shape
        lengths_B = torch.tensor([len(it["prompt_ids"]) + len(it["response_ids"]) - 1 for it in mb.items]
                                 + [0] * (B - len(mb.items)))
        padding_BS = torch.arange(S)[None, :] >= lengths_B[:, None]
        if sequence_parallel and not first_stage:
            tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
            padding_BS = padding_BS.chunk(tp, dim=1)[rank].contiguous()
        return padding_BS.to(mb.tokens_BS.device)

    def _record(self, router: TopKRouter, inputs: Any, output: Any) -> None:
        if not self._recording or not torch.is_grad_enabled():
            return
        _, routing_map = output
        valid_N = self._valid_N.to(routing_map.device)
        routed_E = routing_map[valid_N].sum(0).double().cpu()
        self.tokens_LE[router.layer_number - 1] += routed_E
        self.dropped += float(valid_N.sum()) * self.topk - float(routed_E.sum())

    # ------------------------------------------------------------------ after a train step
    def collect(self) -> dict[str, float]:
        """The step's statistics, the same on every rank (collectives over tp, dp and pp)."""
        self._recording = False
        self.config.moe_aux_loss_coeff, self.config.moe_z_loss_coeff = self.aux_loss_coeff, self.z_loss_coeff
        counts = torch.cat([self.tokens_LE.reshape(-1), torch.tensor([self.dropped], dtype=torch.float64)])
        for group in (ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group(),
                      ps.get_pipeline_model_parallel_group()):
            dist.all_reduce(counts, group=group)  # stages hold disjoint layers: a sum gathers them
        tokens_LE = counts[:-1].reshape(self.num_layers, self.num_experts)
        imbalance_L = tokens_LE.max(1).values / tokens_LE.mean(1).clamp_min(1e-12)
        out = {layer_imbalance_key(i): float(v) for i, v in enumerate(imbalance_L)}
        out[EXPERT_LOAD_IMBALANCE] = float(imbalance_L.max())
        out[DROPPED_TOKENS] = float(counts[-1])
        out.update(self._router_losses())
        return out

    def _router_losses(self) -> dict[str, float]:
        tracker = moe_utils.get_moe_layer_wise_logging_tracker()
        out = {}
        tp_group = ps.get_tensor_model_parallel_group()
        enabled = {"load_balancing_loss": self.aux_loss_coeff > 0, "z_loss": self.z_loss_coeff is not None}
        for name, key in _TRACKED.items():
            entry = tracker.get(name)  # the tracker is per process: an earlier engine's entry stays
            if entry is None or not enabled[name]:
                continue
            values_L = entry["values"].detach().double().cpu()
            dist.all_reduce(values_L, group=ps.get_pipeline_model_parallel_group())
            dist.all_reduce(values_L, group=tp_group)
            if entry.get("reduce_group") is None:  # z-loss: each tp rank's mean over its tokens
                values_L /= dist.get_world_size(tp_group)
            dist.all_reduce(values_L, group=ps.get_data_parallel_group())
            out[key] = float(values_L.mean()) / self.num_micro_batches
        moe_utils.clear_aux_losses_tracker()
        return out

"""Ulysses sequence parallelism for the ``dp`` and ``fsdp`` train backends (verl's
``ulysses_sequence_parallel_size``): every line of a micro-batch split over the ``sp`` ranks of a
group, attention over the whole line by an all-to-all over heads.

The ranks of a worker group form groups of ``sp`` consecutive ranks (verl: dp = world / sp).
Each rank is dispatched its own share of the rows as without sequence parallelism; an engine
with ``sp`` > 1 first gathers its group's shares into one batch (:meth:`SequenceParallel.group_batch`,
``sp`` times the rows, as verl gives every rank of an sp group the same rows) and splits it into
micro-batches of ``micro_batch_size`` rows (token budget: ``sp`` times the per-rank one, as verl's
``max_token_len * ulysses_sp``). For each micro-batch every rank of the group:

1. embeds and runs the MLPs of one slice of every line (:func:`flowrl.data.sequence_split.local_inputs`:
   lines padded to a multiple of ``sp``, global position ids);
2. in each attention layer sends its slice of every head to the head's rank and receives the
   whole line of ``heads / sp`` heads (``all_to_all_single``), attends with the unsplit model's
   mask (:func:`~flowrl.data.sequence_split.full_mask`), and sends the result back
   (:func:`ulysses_attention`, registered with transformers' ``AttentionInterface``; key/value
   heads fewer than ``sp`` are repeated as verl does);
3. computes the logits, log-probs and entropies of the response tokens predicted in its slice and
   sums them over the group (:meth:`SequenceParallel.gather`), so every rank holds the
   micro-batch's whole ``_T`` tensors and computes the same loss. The sum's backward passes each
   rank its own tokens' gradients unchanged, so each rank's parameter gradients are its slice's
   share of the loss's; the usual sum over all ranks (dp's all-reduce, FSDP's reduce-scatter) is
   the unsplit gradient.

Log-probs and values leave the engine as the rank's own rows (:meth:`SequenceParallel.own`).

Shape letters: B rows, H query heads, K key/value heads, Ls a rank's slice, Lp the padded line,
D head dim, T response tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from flowrl.data.sequence_split import concat_batches, local_inputs

if TYPE_CHECKING:
    from flowrl.data.packed import PackedBatch, Padded

__all__ = ["ATTENTION", "SequenceParallel", "sequence_parallel", "ulysses_attention"]

ATTENTION = "flowrl_ulysses"
"""The attention implementation name a model under sequence parallelism runs with."""
BASE_ATTENTION = ("sdpa", "eager")
"""The implementations whose numbers it keeps (the model's own, as loaded)."""
_GROUPS: dict[int, "SequenceParallel"] = {}  # id(model config) -> its group's state


def sequence_parallel(model: torch.nn.Module, size: int, *, pad_id: int, device: torch.device) -> "SequenceParallel | None":
    """The sequence-parallel state of ``model`` at ``size`` ranks a group; None at 1."""
    return SequenceParallel(model, size, pad_id=pad_id, device=device) if size > 1 else None


# ----------------------------------------------------------------- collectives with autograd
def _seq_to_heads(x_BHLsD: torch.Tensor, group: Any, sp: int) -> torch.Tensor:
    """All heads of this rank's slice -> ``heads / sp`` heads (the rank's chunk) of the whole line."""
    b, h, ls, d = x_BHLsD.shape
    send = x_BHLsD.reshape(b, sp, h // sp, ls, d).transpose(0, 1).contiguous()  # [dest rank, B, H/sp, Ls, D]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[i]: rank i's slice of this rank's heads
    return recv.permute(1, 2, 0, 3, 4).reshape(b, h // sp, sp * ls, d)


def _heads_to_seq(y_BhLpD: torch.Tensor, group: Any, sp: int) -> torch.Tensor:
    """The inverse: this rank's heads of the whole line -> every head of this rank's slice."""
    b, h, lp, d = y_BhLpD.shape
    send = y_BhLpD.reshape(b, h, sp, lp // sp, d).permute(2, 0, 1, 3, 4).contiguous()  # [slice owner, B, h, Ls, D]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[i]: rank i's heads of this rank's slice
    return recv.transpose(0, 1).reshape(b, sp * h, lp // sp, d)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, sp):  # noqa: ANN001, ANN205 - autograd's signature
        ctx.group, ctx.sp = group, sp
        return _seq_to_heads(x, group, sp)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return _heads_to_seq(grad.contiguous(), ctx.group, ctx.sp), None, None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group, sp):  # noqa: ANN001, ANN205
        ctx.group, ctx.sp = group, sp
        return _heads_to_seq(y, group, sp)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return _seq_to_heads(grad.contiguous(), ctx.group, ctx.sp), None, None


class _GroupSum(torch.autograd.Function):
    """Sum over the group; the backward passes the gradient through unchanged (every rank then
    computes the same loss of the sum, so each rank's share gets the loss's gradient once)."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: ANN001, ANN205
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        return grad, None


def _repeat_heads(x_BKLD: torch.Tensor, times: int) -> torch.Tensor:
    """Each key/value head ``times`` times in a row (transformers' ``repeat_kv``)."""
    if times == 1:
        return x_BKLD
    b, k, length, d = x_BKLD.shape
    return x_BKLD[:, :, None].expand(b, k, times, length, d).reshape(b, k * times, length, d)


def kv_repeats(num_heads: int, num_kv_heads: int, sp: int) -> int:
    """How often each key/value head is repeated before the all-to-all so every rank gets whole
    groups: 1 when ``sp`` divides the key/value heads, ``sp / K`` when ``K`` divides ``sp`` (verl),
    else every query head its own copy (``H / K``)."""
    if num_kv_heads % sp == 0:
        return 1
    if sp % num_kv_heads == 0:
        return sp // num_kv_heads
    return num_heads // num_kv_heads


def ulysses_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (``query_BHLsD``, ``key/value_BKLsD`` of this
    rank's slice): the whole line's attention of every head, this rank's slice of it, as
    ``[B, Ls, H, D]``. The mask the model built for the slice is not used (none is built:
    ``ATTENTION`` has no mask function); the group's :func:`full_mask` is."""
    sp = _GROUPS.get(id(getattr(module, "config", None)))
    if sp is None or not sp.prepared:
        raise RuntimeError(f"attention implementation {ATTENTION!r} runs only inside a sequence-parallel engine's "
                           "forward (flowrl.backends.train.ulysses); this model was not prepared by one")
    return sp.attention(query, key, value, dropout=dropout, scaling=scaling, extra=kwargs)


def _register() -> None:
    from transformers import AttentionInterface

    if ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION, ulysses_attention)


# ----------------------------------------------------------------- the group
class SequenceParallel:
    """One rank's view of its sequence-parallel group, for one model."""

    def __init__(self, model: torch.nn.Module, size: int, *, pad_id: int, device: torch.device) -> None:
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % size:
            raise ValueError(f"ulysses_sequence_parallel_size={size} does not divide the group's {world} ranks; "
                             f"fix: a divisor of {world} (data_parallel_size)")
        config = model.config
        heads = getattr(config, "num_attention_heads", None)
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        if not heads or heads % size:
            raise ValueError(f"ulysses_sequence_parallel_size={size}: the model's {heads} attention heads do not split "
                             f"over {size} ranks; fix: a divisor of {heads}")
        windows = getattr(config, "layer_types", None) or ()
        if getattr(config, "use_sliding_window", False) or any("sliding" in str(t) for t in windows):
            raise ValueError(f"ulysses_sequence_parallel_size={size}: the model uses sliding-window attention, which "
                             "the sequence-parallel attention does not build; fix: ulysses_sequence_parallel_size=1")
        base = config._attn_implementation
        if base not in BASE_ATTENTION:
            raise ValueError(f"ulysses_sequence_parallel_size={size} needs the model loaded with attention "
                             f"{' or '.join(BASE_ATTENTION)}, it has {base!r}; fix: ulysses_sequence_parallel_size=1")
        # the groups of sp consecutive ranks (every rank creates every group, in the same order)
        groups = [dist.new_group(list(range(start, start + size))) for start in range(0, world, size)]
        self.group, self.size, self.rank = groups[rank // size], size, rank % size
        self.pad_id, self.device, self.eager = pad_id, device, base == "eager"
        self.kv_repeats = kv_repeats(heads, kv_heads, size)
        _register()
        model.set_attn_implementation(ATTENTION)
        if config._attn_implementation != ATTENTION:
            raise ValueError(f"ulysses_sequence_parallel_size={size}: {type(model).__name__} cannot switch its attention "
                             "implementation (it does not use transformers' AttentionInterface); fix: "
                             "ulysses_sequence_parallel_size=1")
        _GROUPS[id(config)] = self
        self._config = config  # held: the key above stays this object's
        self.mask: torch.Tensor | None = None  # the current micro-batch's (kept for recomputation in backward)
        self.causal = False  # the current micro-batch is padded rows: causal attention (sdpa: no mask)
        self.prepared = False  # a micro-batch was split (local): attention may run
        self.keep_T: torch.Tensor | None = None
        self._own = slice(0, 0)

    # ------------------------------------------------------------- batches
    def group_batch(self, batch: "PackedBatch") -> "PackedBatch":
        """The rows of every rank of the group, in rank order, as one batch (remembering where
        this rank's response tokens are, :meth:`own`); token budget ``sp`` times ``batch``'s."""
        from flowrl.data.packed import PackedBatch

        mine = (batch.prompt_P, batch.prompt_cu_B1, batch.response_T, batch.response_cu_B1, batch.token_fields)
        parts: list[Any] = [None] * self.size
        dist.all_gather_object(parts, mine, group=self.group)
        batches = [PackedBatch(p, pc, r, rc, dict(f), batch.token_budget, batch.shared_prompts) for p, pc, r, rc, f in parts]
        start = sum(b.num_response_tokens for b in batches[: self.rank])
        self._own = slice(start, start + batch.num_response_tokens)
        if getattr(batch, "images", None) is not None:
            raise ValueError("ulysses_sequence_parallel_size > 1 splits text lines; this batch has images "
                             "(fix: ulysses_sequence_parallel_size=1 for a vision-language model)")
        return concat_batches(batches, batch.token_budget * self.size)

    def own(self, values_T: torch.Tensor | None) -> torch.Tensor | None:
        """This rank's rows' part of a ``_T`` tensor of the group batch."""
        return None if values_T is None else values_T[self._own]

    # ------------------------------------------------------------- one micro-batch
    def local(self, padded: "Padded") -> "Padded":
        """This rank's slice of ``padded`` (the model's input); remembers the whole lines' mask
        for :func:`ulysses_attention` and which response tokens this rank computes."""
        li = local_inputs(padded, self.pad_id, self.rank, self.size)
        self.keep_T = li.keep_T
        self.causal = li.mask_BLpLp is None  # padded rows: plain causal attention
        mask = None if self.causal else li.mask_BLpLp[:, None].to(self.device)
        if self.eager:  # additive, as transformers' eager mask (float32 promotes bf16 scores)
            if mask is None:
                length = li.padded.input_ids_BL.shape[1] * self.size
                mask = torch.ones((length, length), dtype=torch.bool, device=self.device).tril()[None, None]
            mask = torch.zeros(mask.shape, dtype=torch.float32, device=self.device).masked_fill_(
                ~mask, torch.finfo(torch.float32).min)
        self.mask, self.prepared = mask, True
        return li.padded

    def select(self, values_T: torch.Tensor) -> torch.Tensor:
        """The response tokens this rank computes, of a ``_T`` tensor of the micro-batch."""
        return values_T[self.keep_T]

    def gather(self, *local_T: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """Each rank's tokens' values summed into the micro-batch's whole ``_T`` tensors (with autograd)."""
        keep_T = self.keep_T
        out: list[torch.Tensor | None] = []
        for t in local_T:
            if t is None:
                out.append(None)
                continue
            index = torch.nonzero(keep_T)[:, 0].to(t.device)
            full = t.new_zeros((keep_T.numel(), *t.shape[1:])).index_put((index,), t)
            out.append(_GroupSum.apply(full, self.group))
        return tuple(out)

    # ------------------------------------------------------------- attention
    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, dropout: float,
                  scaling: float | None, extra: dict) -> tuple[torch.Tensor, None]:
        if extra.get("sliding_window") or extra.get("s_aux") is not None or extra.get("softcap"):
            raise ValueError("ulysses_sequence_parallel_size > 1: this model's attention uses a sliding window, "
                             "sinks or soft-capping, which the sequence-parallel attention does not build; fix: "
                             "ulysses_sequence_parallel_size=1")
        sp, group = self.size, self.group
        key, value = _repeat_heads(key, self.kv_repeats), _repeat_heads(value, self.kv_repeats)
        q = _SeqToHeads.apply(query.contiguous(), group, sp)
        k = _SeqToHeads.apply(key.contiguous(), group, sp)
        v = _SeqToHeads.apply(value.contiguous(), group, sp)
        k, v = _repeat_heads(k, q.shape[1] // k.shape[1]), _repeat_heads(v, q.shape[1] // v.shape[1])
        scale = scaling if scaling is not None else q.shape[-1] ** -0.5
        if self.eager:  # transformers' eager_attention_forward
            weights = torch.matmul(q, k.transpose(2, 3)) * scale + self.mask
            weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
            weights = torch.nn.functional.dropout(weights, p=dropout, training=dropout > 0)
            out = torch.matmul(weights, v)
        else:  # padded rows: is_causal (no mask: the fused kernels apply)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=dropout,
                                                                   is_causal=self.causal, scale=scale)
        out = _HeadsToSeq.apply(out.contiguous(), group, sp)  # [B, H, Ls, D]
        return out.transpose(1, 2).contiguous(), None

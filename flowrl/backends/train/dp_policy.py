"""The ``dp`` train backend: a transformers model per rank, data parallel over torch.distributed.

Each rank holds a full replica. Gradients of all micro-batches accumulate locally, then one
flattened all-reduce (SUM) per optimizer step: losses are normalised by *global* token counts
(see ``flowrl.algos.aggregate``), so the summed gradient equals the single-process gradient of
the whole mini-batch, and replicas stay bit-identical.

With ``lora=`` (``model.lora_rank`` > 0) only peft's adapters train and sit in AdamW; the
reference policy is the base model in this process (``reference_logprobs``: adapters disabled);
weights leave merged under the plain model's names (``flowrl.models.lora``; to vLLM the adapters
leave alone, ``flowrl.backends.reshard.adapters``); checkpoints hold the adapters (the base weights
stay ``model.path``'s).

Shape letters: B rows, L padded length, T response tokens, H hidden, V vocabulary.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from flowrl.algos import entropy_from_logits, logprobs_from_logits
from flowrl.algos.advantages import sum_pi_squared_from_logits
from flowrl.algos.sft_loss import UNIFORM_NLL, uniform_nll_from_logits
from flowrl.backends.interfaces import LossFn, model_kwargs, torch_dtype
from flowrl.backends.train.optim import AdamWSettings
from flowrl.backends.train.precision import autocast, placement, to_host
from flowrl.backends.vlm import vlm_hidden
from flowrl.data.packed import PackedBatch
from flowrl.metrics import names
from flowrl.models import moe_routing
from flowrl.models import vlm
from flowrl.parallel.dtypes import engine_precision

if TYPE_CHECKING:
    from flowrl.backends.train.ulysses import SequenceParallel
    from flowrl.data.packed import Padded
    from flowrl.models.lora import LoraSpec


FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TOKEN_STATS = {"entropy": entropy_from_logits, UNIFORM_NLL: uniform_nll_from_logits,
               "sum_pi_squared": sum_pi_squared_from_logits}
"""The second per-token tensor ``train_step`` may give its loss (``token_stat``): the softmax's
entropy (RL's entropy bonus) or its cross-entropy against the uniform distribution (SFT's label
smoothing), or the sum of the softmax's squares (``optimal_token_baseline``'s input, from the
old-log-prob pass: ``forward_logprobs(token_stat="sum_pi_squared")``)."""


def adamw(params: list[torch.nn.Parameter], **kwargs: Any) -> torch.optim.AdamW:
    """torch's AdamW, with its fused kernel where every parameter is a plain CPU or CUDA tensor:
    one pass over each tensor instead of a dozen (measured on a 9.5M-parameter model, one
    thread: 9 ms a step against 51 ms), the same update to rounding (2e-7 after 20 steps)."""
    params = list(params)
    fused = bool(params) and all(type(p.data) is torch.Tensor and p.device.type in ("cpu", "cuda")
                                 and p.dtype in FUSED_DTYPES for p in params)
    return torch.optim.AdamW(params, fused=fused or None, **kwargs)


class TorchDPEngine:
    device = torch.device("cpu")
    """Where the model, its optimizer state and each micro-batch are (the rank's ``device``);
    log-probs, values and every tensor that leaves the engine come back to the host."""
    precision = engine_precision("cpu", "float32")
    """Parameter and compute dtypes (:func:`flowrl.parallel.dtypes.engine_precision`): on a GPU
    fp32 parameters under bf16 autocast, on the CPU the compute dtype throughout."""
    ulysses: "SequenceParallel | None" = None
    """Ulysses sequence parallelism (``ulysses_sequence_parallel_size`` > 1): this rank's group,
    which splits every line of a micro-batch (``flowrl.backends.train.ulysses``); None: off."""
    lora: LoraSpec | None = None
    """The LoRA adapters (``model.lora_rank`` > 0): only they train; None: every weight trains."""
    peft_model: Any = None
    """peft's wrapper of ``model`` with LoRA (``disable_adapter()``: the reference policy)."""

    def __init__(
        self,
        model_dir: str,
        *,
        trainable: bool = True,
        dtype: str = "float32",
        device: str = "cpu",
        seed: int = 0,
        lora: dict | None = None,
        ulysses_sequence_parallel_size: int = 1,
        **optim: Any,
    ) -> None:
        """``optim``: the optimizer keywords of :class:`~flowrl.backends.train.optim.AdamWSettings`;
        ``device``: the rank's (``cuda:0`` on a GPU rank), ``dtype``: ``model.dtype`` (``auto``
        resolved by the device)."""
        freeze_vision = optim.pop("freeze_vision_tower", False)  # a VLM's actor.freeze_vision_tower
        settings = AdamWSettings(**optim)
        torch.manual_seed(seed)
        self.device, self.precision = placement(device, dtype, trainable=trainable)
        self.model = self._load_model(model_dir, torch_dtype(self.precision.param_dtype)).to(self.device)
        if freeze_vision:
            vlm.freeze_vision_tower(self.model)
        self._add_adapters(lora)
        self.pad_id = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        self.grad_clip = settings.grad_clip
        self.optimizer = None
        if trainable:
            self.model.train()
            self.optimizer = adamw(self._trainable_parameters(), **settings.adamw_kwargs())
        else:
            self.model.eval()
            self.model.requires_grad_(False)
        self._broadcast_parameters()
        self._sequence_parallel(ulysses_sequence_parallel_size)

    def _sequence_parallel(self, size: int) -> None:
        """Ulysses over groups of ``size`` ranks (``flowrl.backends.train.ulysses``; 1: off)."""
        from flowrl.backends.train.ulysses import sequence_parallel

        self.ulysses = sequence_parallel(self.model, size, pad_id=self.pad_id, device=self.device)

    def _load_model(self, model_dir: str, dtype: torch.dtype) -> torch.nn.Module:
        """The trained module (subclasses load another head on the same checkpoint)."""
        from transformers import AutoModelForCausalLM

        vlm.register_auto_classes()  # Qwen2-VL / Qwen2.5-VL load as causal LMs (flowrl.models.vlm)
        return vlm.with_text_ids(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype))

    # ----------------------------------------------------------------- LoRA
    def _add_adapters(self, lora: dict | None) -> None:
        """With ``lora`` (a ``LoraSpec.to_dict()``): peft's adapters in ``model``, the rest frozen."""
        if lora:
            from flowrl.models.lora import LoraSpec, add_adapters

            self.lora = LoraSpec.from_dict(lora)
            self.peft_model = add_adapters(self.model, self.lora)

    def _trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer holds: the adapters with LoRA, else every parameter."""
        return [p for p in self.model.parameters() if p.requires_grad or self.lora is None]

    def _state_named(self) -> dict[str, torch.nn.Parameter]:
        """The parameters a checkpoint holds by name: the adapters with LoRA (the base weights are
        ``model.path``'s, frozen), else every parameter (tied weights once)."""
        from flowrl.models.lora import is_trained

        return {n: p for n, p in self.model.named_parameters() if self.lora is None or is_trained(n)}

    def _plain(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full tensors by the model's own names, LoRA adapters merged into their layers' weights."""
        if self.lora is None:
            return tensors
        from flowrl.models.lora import merged_weights

        return merged_weights(self.model, tensors)

    def reference_logprobs(self, batch: PackedBatch, *, micro_batch_size: int, temperature: float = 1.0) -> torch.Tensor:
        """Response-token log-probs of the base model (adapters disabled): with LoRA the reference
        policy is the actor's own frozen weights, in this process. Every rank calls it."""
        if self.peft_model is None:
            raise RuntimeError("reference_logprobs: this engine has no LoRA adapters (model.lora_rank=0); "
                               "the reference policy runs on its own worker group")
        with self.peft_model.disable_adapter():
            return self.forward_logprobs(batch, micro_batch_size=micro_batch_size, temperature=temperature)[0]

    # ----------------------------------------------------------------- collectives
    @property
    def dp_size(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else 1

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Sum small host values over the data-parallel group."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.dp_size > 1:
            dist.all_reduce(t)
        return t.tolist()

    def _broadcast_parameters(self) -> None:
        if self.dp_size > 1:
            for p in self.model.parameters():
                dist.broadcast(p.data, src=0)

    # ----------------------------------------------------------------- forward
    same_micro_batch_count = False
    """Every rank must run as many micro-batches (FSDP: collectives in each forward/backward)."""
    slots_computed = 0
    """Model positions computed so far (padding included): the update's padding ratio."""

    def _micro_batches(self, batch: PackedBatch, micro_batch_size: int) -> list[PackedBatch]:
        """``batch``'s micro-batches (by rows, or by its token budget); with
        ``same_micro_batch_count`` token-budget splits agree on the largest count over the ranks."""
        if self.ulysses is not None:  # the sp group's rows, each line split over its ranks
            batch = self.ulysses.group_batch(batch)
        mbs = list(batch.micro_batches(micro_batch_size))
        if batch.token_budget <= 0 or not self.same_micro_batch_count or self.dp_size == 1:
            return mbs
        count = torch.tensor([len(mbs)], dtype=torch.int64, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return mbs if int(count) == len(mbs) else list(batch.micro_batches(micro_batch_size, int(count)))

    @property
    def pair_cost(self) -> float:
        """An attention query-key pair's cost against a position's linear layers (shared-prompt
        layouts split long groups by it; ``token_layout.PAIR_COST_PER_HIDDEN``)."""
        from flowrl.data.token_layout import PAIR_COST_PER_HIDDEN

        hidden = getattr(self.model.config, "hidden_size", 0)
        return PAIR_COST_PER_HIDDEN / hidden if hidden else 0.0

    def _hidden(self, mb: PackedBatch, padded: Padded) -> torch.Tensor:
        """The decoder's last hidden state ``[B or R, L, H]`` of ``padded`` (``mb``'s layout): with
        ``mb``'s images through the vision tower (:func:`flowrl.backends.vlm.vlm_hidden`: the
        critic's VLM forward too), else the decoder on the ids."""
        attn = self.model.config._attn_implementation
        if mb.images is not None:
            return vlm_hidden(self.model, mb, padded, self.device, attn)
        return self.model.get_decoder()(**model_kwargs(padded, self.device, attn)).last_hidden_state

    def _forward(self, mb: PackedBatch, *, temperature: float, with_entropy: bool,
                 token_stat: str = "entropy") -> tuple[torch.Tensor, torch.Tensor | None]:
        padded, dev = mb.model_inputs(self.pad_id, self.pair_cost), self.device
        response_T = mb.response_T
        if self.ulysses is not None:  # this rank's slice of every line (flowrl.backends.train.ulysses)
            padded, response_T = self.ulysses.local(padded), self.ulysses.select(response_T)
        self.slots_computed += padded.num_slots
        tap = moe_routing.router_tap(self, mb, padded)  # MoE: routing replay and router stats (else None)
        with autocast(dev, self.precision), tap or contextlib.nullcontext():
            hidden_BLH = self._hidden(mb, padded)
            # Logits only where a response token is predicted: at pred_T (pos - 1 unless prompts are shared).
            hidden_TH = hidden_BLH[padded.row_T.to(dev), padded.pred_T.to(dev)]
            logits_TV = self.model.get_output_embeddings()(hidden_TH)
        logits_TV = logits_TV.float()
        if temperature != 1.0:
            logits_TV = logits_TV / temperature
        logp_T = logprobs_from_logits(logits_TV, response_T.long().to(dev))
        entropy_T = TOKEN_STATS[token_stat](logits_TV) if with_entropy else None
        if self.ulysses is not None:  # the group's tokens: every rank the micro-batch's whole _T
            logp_T, entropy_T = self.ulysses.gather(logp_T, entropy_T)
        # results on the host, where the losses' inputs are (no copy on the CPU)
        return logp_T.cpu(), (entropy_T.cpu() if entropy_T is not None else None)

    @torch.no_grad()
    def forward_logprobs(
        self, batch: PackedBatch, *, micro_batch_size: int, temperature: float = 1.0, with_entropy: bool = False,
        token_stat: str = "entropy",
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Response-token log-probs (and with ``with_entropy`` the ``token_stat`` of
        :data:`TOKEN_STATS`, entropies by default) of ``logits / temperature``, flat ``_T``."""
        was_training = self.model.training
        self.model.eval()
        try:
            outs = [self._forward(mb, temperature=temperature, with_entropy=with_entropy, token_stat=token_stat)
                    for mb in self._micro_batches(batch, micro_batch_size)]
        finally:
            self.model.train(was_training)
        logp_T = torch.cat([o[0] for o in outs]) if outs else torch.empty(0)
        entropy_T = torch.cat([o[1] for o in outs]) if with_entropy and outs else None
        if self.ulysses is not None:  # this rank's rows of the group's
            logp_T, entropy_T = self.ulysses.own(logp_T), self.ulysses.own(entropy_T)
        return logp_T, entropy_T

    # ----------------------------------------------------------------- update
    def train_step(
        self, batch: PackedBatch, *, micro_batch_size: int, loss_fn: LossFn, temperature: float = 1.0, with_entropy: bool = True,
        token_stat: str = "entropy",
    ) -> dict[str, float]:
        """One optimizer step over ``batch`` (this rank's share), accumulating micro-batches.

        ``loss_fn`` returns a loss already normalised by the global denominator, so losses are
        summed, not averaged, over micro-batches and ranks. Stats are token-weighted means.
        With ``with_entropy`` its second argument is the ``token_stat`` of :data:`TOKEN_STATS`.
        """
        if token_stat not in TOKEN_STATS:
            raise ValueError(f"token_stat={token_stat!r} is not one of {', '.join(TOKEN_STATS)}")

        def mb_loss(mb: PackedBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            logp_T, entropy_T = self._forward(mb, temperature=temperature, with_entropy=with_entropy,
                                              token_stat=token_stat)
            return moe_routing.add_moe_loss(self, mb, *loss_fn(logp_T, entropy_T, mb))

        moe_routing.count_positions(self, batch)
        return self._accumulate_and_step(batch, micro_batch_size, mb_loss)

    def _accumulate_and_step(
        self, batch: PackedBatch, micro_batch_size: int,
        mb_loss: Callable[[PackedBatch], tuple[torch.Tensor, dict[str, torch.Tensor]]],
    ) -> dict[str, float]:
        """Backward ``mb_loss`` of every micro-batch, then one reduced optimizer step; stats are
        token-weighted means over all ranks, plus ``grad_norm`` and ``lr``."""
        assert self.optimizer is not None, "train step on a frozen engine"
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {names.TRAIN_SLOTS: -float(self.slots_computed)}
        tokens = 0
        for mb in self._micro_batches(batch, micro_batch_size):
            loss, stats = mb_loss(mb)
            loss.backward()
            n = mb.num_response_tokens
            tokens += n
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + float(v) * n
        grad_norm = self._reduce_gradients_and_step()
        sums[names.TRAIN_SLOTS] += self.slots_computed
        sums[names.TRAIN_TOKENS] = float(batch.num_tokens)
        keys = sorted(sums)
        totals = self.all_reduce_sum([sums[k] for k in keys] + [float(tokens)])
        denom = max(totals[-1], 1.0)
        out = {k: totals[i] if k in (names.TRAIN_SLOTS, names.TRAIN_TOKENS) else totals[i] / denom
               for i, k in enumerate(keys)}
        out[names.GRAD_NORM] = grad_norm
        out[names.LR] = self.optimizer.param_groups[0]["lr"]
        return out

    def _reduce_gradients_and_step(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if self.dp_size > 1:
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                g.copy_(synced)
        for p, g in zip(params, grads):
            p.grad = g
        if self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        self.optimizer.step()
        return float(norm)

    # ----------------------------------------------------------------- weights
    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The full HF-named state on the host (every rank holds it; rank 0's is used), adapters merged."""
        return to_host(self._plain(dict(self.model.state_dict())))

    def reshard_source(self) -> dict[str, torch.Tensor]:
        """The live parameters by HF name (tied weights once): this rank's source tensors for a
        reshard (``hf`` style, tp = pp = 1); with LoRA the merged weights (new tensors)."""
        return self._plain({n: p.detach() for n, p in self.model.named_parameters()})

    def grad_state_dict(self) -> dict[str, torch.Tensor]:
        """The data-parallel-reduced gradients of the last step, by HF name, on the host (for checks)."""
        return to_host({n: p.grad for n, p in self.model.named_parameters() if p.grad is not None})

    def save_hf(self, directory: str) -> None:
        """A transformers directory (with LoRA: the merged model, as ``export-hf --merge-lora``)."""
        self.model.save_pretrained(directory, state_dict=self.hf_state_dict() if self.lora else None)

    # ----------------------------------------------------------------- checkpoints
    OPTIM_STATES = ("exp_avg", "exp_avg_sq")

    def checkpoint_state(self) -> dict:
        """Full parameters by HF name (tied weights once, as ``named_parameters`` names them; with
        LoRA the adapters only), AdamW's ``exp_avg`` / ``exp_avg_sq`` by the same names, and the
        optimizer step count.

        ``optim`` is empty before the first optimizer step. Replicas are identical, so any
        rank's state is the model's."""
        named = self._state_named()
        params = to_host(named)
        optim: dict[str, dict[str, torch.Tensor]] = {}
        step = 0
        if self.optimizer is not None:
            for n, p in named.items():
                state = self.optimizer.state.get(p)
                if not state:
                    continue
                for key in self.OPTIM_STATES:
                    optim.setdefault(key, {})[n] = state[key].detach().to("cpu", copy=True)
                step = max(step, int(float(state["step"])))
        return {"params": params, "optim": optim, "optim_step": step}

    @torch.no_grad()
    def load_checkpoint(self, params: dict, optim: dict | None = None, optim_step: int = 0) -> None:
        """Restore parameters and (when given) AdamW state saved by ``checkpoint_state``,
        exactly; every rank loads the same full tensors, so replicas stay identical."""
        named = self._state_named()
        missing = sorted(set(named) - set(params))
        unexpected = sorted(set(params) - set(named))
        if missing or unexpected:
            raise ValueError(f"checkpoint holds another model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for n, p in named.items():
            src = torch.as_tensor(params[n])
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(f"checkpoint parameter {n} has shape {tuple(src.shape)}, the model {tuple(p.shape)}")
            p.copy_(src.to(p.dtype))
        if self.optimizer is None or not optim:
            return
        for key in self.OPTIM_STATES:
            if set(optim.get(key, {})) != set(named):
                raise ValueError(f"checkpoint optimizer state {key!r} does not cover every parameter")
        self.optimizer.state.clear()
        for n, p in named.items():
            self.optimizer.state[p] = {
                # fused AdamW keeps its step count on the parameter's device
                "step": torch.tensor(float(optim_step), dtype=torch.float32,
                                     device=p.device if self._fused_optimizer() else "cpu"),
                **{key: torch.as_tensor(optim[key][n]).to(device=p.device, dtype=p.dtype).clone() for key in self.OPTIM_STATES},
            }

    def _fused_optimizer(self) -> bool:
        return bool(self.optimizer is not None and self.optimizer.defaults.get("fused"))

    def generation_module(self) -> torch.nn.Module:
        """The live module a generation engine in this process may generate with (the hybrid
        engine): a full replica, so its parameters are the generation weights (LoRA: adapters on);
        None under sequence parallelism (its attention runs only inside the group's forward)."""
        return self.model if self.ulysses is None else None

    def param_bytes_local(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def close(self) -> None:
        """Nothing to release: the model goes with the process, the process group with its actor."""

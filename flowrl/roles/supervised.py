"""Supervised updates of the policy (SFT, DPO): a :class:`~flowrl.algos.supervised.SupervisedLoss`
named by import string, trained through the engine's ``train_step`` on any train backend (dp,
fsdp, megatron, LoRA), epochs over mini-batches as the PPO update.

The policy role's :meth:`~flowrl.roles.policy.PolicyRole.train_supervised` and
:meth:`~flowrl.roles.policy.PolicyRole.supervised_logprobs` call these functions; they are kept
here so the role stays the RL role it was (its PPO path is untouched).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flowrl.algos.supervised import SupervisedLoss, Totals, means
from flowrl.data import experience
from flowrl.data.packed import PackedBatch
from flowrl.metrics import names
from flowrl.registry import import_string
from flowrl.roles.epochs import run_epochs

if TYPE_CHECKING:
    from flowrl.config import ActorConfig

SUPERVISED_TEMPERATURE = 1.0
"""Supervised losses read the model's own distribution (no sampling temperature)."""


def load_loss(loss: str) -> SupervisedLoss:
    """The :class:`SupervisedLoss` at import string ``loss`` (``flowrl.algos.sft_loss:SFT_LOSS``)."""
    spec = import_string(loss)
    if not isinstance(spec, SupervisedLoss):
        raise TypeError(f"{loss!r} is {type(spec).__name__}, not a flowrl.algos.supervised.SupervisedLoss")
    return spec


def micro_batch_rows(actor: "ActorConfig", spec: SupervisedLoss) -> int:
    """Rows per micro-batch: ``actor.ppo_micro_batch_size_per_gpu`` sequences, or pairs (two rows each)."""
    return actor.ppo_micro_batch_size_per_gpu * (2 if spec.pairs else 1)


def token_budget(actor: "ActorConfig", spec: SupervisedLoss) -> int:
    """Packing by ``actor.ppo_max_token_len_per_gpu`` with ``actor.use_dynamic_bsz`` (pairs: never,
    a budget split could part a pair; the families refuse it before any worker starts)."""
    return actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz and not spec.pairs else 0


def train(engine: Any, actor: "ActorConfig", table: pa.Table, *, loss: str, mini_batch_rows: int, options: dict,
          mfu: Any = None) -> dict[str, float]:
    """``actor.ppo_epochs`` passes over this rank's share of ``table``, one optimizer step per
    mini-batch of ``mini_batch_rows`` rows; ``actor/<stat>`` metrics (``run_epochs``)."""
    spec = load_loss(loss)
    batch = PackedBatch.from_table(table, spec.fields)
    stat = spec.stat_for(options)  # label smoothing's uniform_nll: the engine's second per-token tensor
    extra = {"with_entropy": True, "token_stat": stat} if stat is not None else {"with_entropy": False}

    def step(mini: PackedBatch) -> dict[str, float]:
        def train_step(loss_fn):  # noqa: ANN001, ANN202 - the engines' LossFn
            return engine.train_step(mini.with_token_budget(token_budget(actor, spec)),
                                     micro_batch_size=micro_batch_rows(actor, spec),
                                     loss_fn=lambda logp_T, stat_T, mb: loss_fn(logp_T, mb, stat_T),
                                     temperature=SUPERVISED_TEMPERATURE, **extra)

        return reduced_step(engine, spec, mini, train_step, options)

    return run_epochs(batch, epochs=actor.ppo_epochs, mini_batch_rows=mini_batch_rows, step=step, prefix=names.ACTOR,
                      mfu=mfu)


def reduced_step(engine: Any, spec: SupervisedLoss, mini: PackedBatch, train_step: Any, options: dict) -> dict[str, float]:
    """One optimizer step of ``spec`` on ``mini``: the global denominator first, then
    ``train_step(loss_fn)`` (the engine's step with ``loss_fn(value, micro_batch)``), then the
    loss's summed stats reduced over the data-parallel ranks into exact means (engines average
    their own stats in their own ways: by tokens, by micro-batches)."""
    (count,) = engine.all_reduce_sum([spec.count(mini.token_fields, mini.response_cu_B1)])
    totals = Totals(count)
    sums = dict.fromkeys(spec.stats, 0.0)

    stat = spec.stat_for(options)

    def loss_fn(value: Any, mb: PackedBatch, stat_T: Any = None) -> tuple[Any, dict]:
        extra = {f"{stat}_T": stat_T} if stat is not None else {}
        loss, stats = spec.fn(value, mb.token_fields, mb.response_cu_B1, totals=totals, **options, **extra)
        for k, v in stats.items():
            sums[k] += float(v)
        return loss, {}

    out = train_step(loss_fn)
    reduced = engine.all_reduce_sum([sums[k] for k in spec.stats])
    return {**out, **means(dict(zip(spec.stats, reduced)), totals)}


def logprobs(engine: Any, actor: "ActorConfig", table: pa.Table, column: str) -> pa.Table:
    """A one-column table: ``column``, the response-token log-probs at temperature 1 (validation)."""
    batch = PackedBatch.from_table(table).with_token_budget(actor.log_prob_max_token_len_per_gpu
                                                             if actor.log_prob_use_dynamic_bsz else 0)
    logp_T, _ = engine.forward_logprobs(batch, micro_batch_size=actor.ppo_micro_batch_size_per_gpu,
                                        temperature=SUPERVISED_TEMPERATURE)
    return pa.table({column: experience.list_column(logp_T, batch.response_cu_B1, experience.TOKEN_FLOATS)})

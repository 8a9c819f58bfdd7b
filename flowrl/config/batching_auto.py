"""``auto`` for the batching keys of the actor, the reference and the critic, resolved from the
config alone (pure: no I/O, no torch), before any worker starts.

The keys: token-budget micro-batches (``use_dynamic_bsz`` for updates, ``log_prob_use_dynamic_bsz``
for forward passes; the critic's one ``use_dynamic_bsz`` covers both), their budgets
(``ppo_max_token_len_per_gpu``, ``log_prob_max_token_len_per_gpu``,
``forward_max_token_len_per_gpu``; 0: derived) and shared-prompt segments (``use_prefix_grouper``).
:func:`resolve_batching` decides, in this order:

1. **An explicit value stays.** ``true``/``false`` mean what they mean in verl (an explicit
   ``true`` on a backend without the capability is refused by the section's check).
2. **verl's interpolations.** verl's YAML makes ``rollout.log_prob_use_dynamic_bsz``,
   ``ref.log_prob_use_dynamic_bsz`` and ``critic.use_dynamic_bsz`` follow
   ``actor.use_dynamic_bsz``, and the log-prob budgets follow ``actor.ppo_max_token_len_per_gpu``
   (the critic's forward budget its update budget): an ``auto`` (or 0) whose verl source is
   explicit follows it, where its own backend has the capability. ``ref.``/``critic.use_prefix_grouper`` follow an explicit
   ``actor.use_prefix_grouper`` likewise (verl has the actor's key only).
3. **The cost estimate**, where the role's backend has the capability (its spec's
   ``token_budget`` / ``shared_prompts``; megatron has neither, so ``auto`` is off there):

   * *Token budget: on.* A micro-batch's packed lines are as long as its longest sequence and
     never more numerous than its rows, so for the same rows packing never computes more
     positions than padding each row to the longest; and the derived budget (below) holds at
     least the rows of a row micro-batch, so no more micro-batches either. Responses stop at EOS
     at spread lengths, so it wins whenever lengths differ, and ties where they do not (the
     losses and gradients are the same: ``tests/unit/test_token_budget.py``).
   * *Shared prompts: on when they save at least* :data:`MIN_SAVED_SHARE` *of the positions.* A
     group of ``n = rollout.n`` samples computes its prompt once instead of ``n`` times: with
     prompts of ``P`` tokens (``data.max_prompt_length``) and responses of ``R``
     (``rollout.response_length``) that saves ``(n - 1) / n * P / (P + R)`` of the positions:
     nothing for ``n = 1``, little where responses dwarf prompts (``P=64, R=4096``: 1.4%), where
     the block attention mask (dense, no fused causal kernel) is not worth it. Groups where dense
     attention over one segment costs more than the prompt saves are still split at run time
     (``token_layout.cheapest_segments``).

**Derived budgets** (0): ``rows * (P + R)``, the positions of the role's row micro-batch
(``ppo_micro_batch_size_per_gpu``, ``log_prob_micro_batch_size_per_gpu``,
``forward_micro_batch_size_per_gpu``) at the longest prompt plus response, so a token
micro-batch never needs more activation memory than the row micro-batch the run is sized for
(the engine's memory is what those row counts were chosen to fit; the model's shape is not known
before a worker loads it). A budget below one sequence is raised to ``P + R``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from flowrl.catalog.backends import TRAIN_BACKENDS, VALUE_BACKENDS

#: Shared prompts are chosen by ``auto`` when they save at least this share of the positions.
MIN_SAVED_SHARE = 0.1
#: verl's budgets, for a section used outside a run (:func:`settled`): actor/ref and critic.
VERL_BUDGET, VERL_CRITIC_BUDGET = 16384, 32768
AUTO = "auto"


@dataclass(frozen=True)
class Shapes:
    """What the estimate reads besides the sections: the group size and the longest lengths."""

    n: int
    prompt_len: int
    response_len: int

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def saved_share(self) -> float:
        """Share of positions shared prompts save: ``(n - 1) / n * P / (P + R)``."""
        return (self.n - 1) / self.n * self.prompt_len / self.seq_len


@dataclass(frozen=True)
class Resolved:
    """One role's resolved keys (``values``: section field -> bool or budget) and why."""

    role: str
    values: dict[str, Any]
    reasons: dict[str, str]


def _switch(value: Any, source: Any, capable: bool, win: bool, why_win: str) -> tuple[bool, str]:
    """(on, why) for one switch: explicit; else off without the capability; else following an
    explicit ``source``; else the estimate."""
    if value != AUTO:
        return bool(value), "set"
    if not capable:
        return False, "auto: the backend lacks it"
    if source is not None and source != AUTO:
        return bool(source), "auto: follows the actor's explicit value (verl's interpolation)"
    return win, why_win


def _budget(value: int, source: int, rows: int, shapes: Shapes) -> tuple[int, str]:
    if value > 0:
        return value, "set"
    if source > 0:
        return source, "derived: follows the explicit update budget (verl's interpolation)"
    return max(shapes.seq_len, rows * shapes.seq_len), f"derived: {rows} rows x {shapes.seq_len} tokens"


def _prefix(value: Any, source: Any, capable: bool, shapes: Shapes) -> tuple[bool, str]:
    share = shapes.saved_share
    win = shapes.n > 1 and share >= MIN_SAVED_SHARE
    why = (f"auto: saves {share:.0%} of positions (rollout.n={shapes.n}, prompts <= {shapes.prompt_len}, responses "
           f"<= {shapes.response_len} tokens)" + ("" if win else f", under {MIN_SAVED_SHARE:.0%}"))
    return _switch(value, source, capable, win, why)


def _actor(a: Any, shapes: Shapes) -> Resolved:
    spec = TRAIN_BACKENDS.spec(a.strategy)
    out: dict[str, Any] = {}
    why: dict[str, str] = {}
    explicit = None if a.use_dynamic_bsz == AUTO else a.use_dynamic_bsz
    out["use_dynamic_bsz"], why["use_dynamic_bsz"] = _switch(a.use_dynamic_bsz, None, spec.token_budget, True, "auto: packed")
    out["log_prob_use_dynamic_bsz"], why["log_prob_use_dynamic_bsz"] = _switch(
        a.log_prob_use_dynamic_bsz, explicit, spec.token_budget, True, "auto: packed")
    rows = a.ppo_micro_batch_size_per_gpu
    out["ppo_max_token_len_per_gpu"], why["ppo_max_token_len_per_gpu"] = _budget(a.ppo_max_token_len_per_gpu, 0, rows, shapes)
    out["log_prob_max_token_len_per_gpu"], why["log_prob_max_token_len_per_gpu"] = _budget(
        a.log_prob_max_token_len_per_gpu, a.ppo_max_token_len_per_gpu, rows, shapes)
    out["use_prefix_grouper"], why["use_prefix_grouper"] = _prefix(a.use_prefix_grouper, None, spec.shared_prompts, shapes)
    return Resolved("actor", out, why)


def _ref(r: Any, a: Any, shapes: Shapes) -> Resolved:
    spec = TRAIN_BACKENDS.spec(a.strategy)  # the reference runs on the actor's backend
    out: dict[str, Any] = {}
    why: dict[str, str] = {}
    source = None if a.use_dynamic_bsz == AUTO else a.use_dynamic_bsz
    out["log_prob_use_dynamic_bsz"], why["log_prob_use_dynamic_bsz"] = _switch(
        r.log_prob_use_dynamic_bsz, source, spec.token_budget, True, "auto: packed")
    out["log_prob_max_token_len_per_gpu"], why["log_prob_max_token_len_per_gpu"] = _budget(
        r.log_prob_max_token_len_per_gpu, a.ppo_max_token_len_per_gpu, r.log_prob_micro_batch_size_per_gpu, shapes)
    prefix_source = None if a.use_prefix_grouper == AUTO else a.use_prefix_grouper
    out["use_prefix_grouper"], why["use_prefix_grouper"] = _prefix(r.use_prefix_grouper, prefix_source,
                                                                   spec.shared_prompts, shapes)
    return Resolved("ref", out, why)


def _critic(c: Any, a: Any, shapes: Shapes) -> Resolved:
    spec = VALUE_BACKENDS.spec(c.strategy)
    out: dict[str, Any] = {}
    why: dict[str, str] = {}
    source = None if a.use_dynamic_bsz == AUTO else a.use_dynamic_bsz
    out["use_dynamic_bsz"], why["use_dynamic_bsz"] = _switch(c.use_dynamic_bsz, source, spec.token_budget, True, "auto: packed")
    out["ppo_max_token_len_per_gpu"], why["ppo_max_token_len_per_gpu"] = _budget(
        c.ppo_max_token_len_per_gpu, 0, c.ppo_micro_batch_size_per_gpu, shapes)
    out["forward_max_token_len_per_gpu"], why["forward_max_token_len_per_gpu"] = _budget(
        c.forward_max_token_len_per_gpu, c.ppo_max_token_len_per_gpu, c.forward_micro_batch_size_per_gpu, shapes)
    prefix_source = None if a.use_prefix_grouper == AUTO else a.use_prefix_grouper
    out["use_prefix_grouper"], why["use_prefix_grouper"] = _prefix(c.use_prefix_grouper, prefix_source,
                                                                   spec.shared_prompts, shapes)
    return Resolved("critic", out, why)


def shapes_of(cfg: Any) -> Shapes:
    """The estimate's inputs from a ``RunConfig``: ``rollout.n``, ``data.max_prompt_length``,
    ``rollout.response_length``."""
    return Shapes(n=cfg.rollout.n, prompt_len=cfg.data.max_prompt_length, response_len=cfg.rollout.response_length)


def resolve_batching(cfg: Any) -> dict[str, Resolved]:
    """The resolved batching keys of ``cfg``'s actor, ref and critic (see the module's rules)."""
    shapes = shapes_of(cfg)
    return {"actor": _actor(cfg.actor, shapes), "ref": _ref(cfg.ref, cfg.actor, shapes),
            "critic": _critic(cfg.critic, cfg.actor, shapes)}


def resolved_section(cfg: Any, role: str) -> Any:
    """``cfg.<role>`` (actor, ref or critic) with its batching keys resolved: no ``auto``, no 0 budget."""
    return dataclasses.replace(getattr(cfg, role), **resolve_batching(cfg)[role].values)


def settled(section: Any) -> Any:
    """A section as a role uses it when no run resolved it (a role built directly, in a test or a
    notebook): ``auto`` is off and a 0 budget is verl's default. A resolved section comes back as is."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.name.endswith("use_dynamic_bsz") or f.name == "use_prefix_grouper":
            if value == AUTO:
                changes[f.name] = False
        elif f.name.endswith("max_token_len_per_gpu") and value == 0:
            changes[f.name] = VERL_CRITIC_BUDGET if hasattr(section, "forward_max_token_len_per_gpu") else VERL_BUDGET
    return dataclasses.replace(section, **changes) if changes else section


def batching_roles(cfg: Any) -> tuple[str, ...]:
    """The roles of ``cfg``'s run that batch: the actor, the reference group when one starts
    (with LoRA the actor computes the reference), the critic when the estimator reads values."""
    ref = ("ref",) if cfg.needs_reference and not cfg.model.lora_rank else ()
    return ("actor", *ref, *(("critic",) if cfg.needs_critic else ()))


def describe_batching(cfg: Any, roles: tuple[str, ...] | None = None) -> list[str]:
    """One line per role (``roles``, default :func:`batching_roles`): ``batching actor:
    use_dynamic_bsz=True (auto: packed), ...``, what the run uses and why (printed at start,
    written atop the run's ``config.yaml``)."""
    resolved = resolve_batching(cfg)
    lines = []
    for role in batching_roles(cfg) if roles is None else roles:
        r = resolved[role]
        parts = [f"{k}={v}" + ("" if r.reasons[k] == "set" else f" ({r.reasons[k]})") for k, v in r.values.items()]
        lines.append(f"batching {role}: " + ", ".join(parts))
    return lines

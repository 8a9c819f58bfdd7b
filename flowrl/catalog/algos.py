"""The catalogue of the algorithm core: every built-in by import string, with its traits.

Floor 0, torch-free: the config validates names and reads traits (does this estimator need a
critic?) from here without importing a torch module. The functions live in the torch modules of
``flowrl/algos/`` (``advantages.py``, ``policy_loss.py``, ``kl.py``, ``aggregate.py``,
``kl_control.py``); a lookup (``ADVANTAGE_ESTIMATORS.get("grpo")``) imports the module that
defines the entry. ``flowrl.algos.registries`` re-exports this module (its old home).

A built-in gets one line here. User code registers its own with the decorators
(``@register_estimator`` in ``flowrl.algos``, ``@register_policy_loss``,
``@register_kl_estimator`` below) or names a function by import string in the config
(``algorithm.adv_estimator=my_pkg.my_mod:my_estimator``).
"""

from __future__ import annotations

from typing import Any, Callable

from flowrl.registry import Registry, import_string

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "FILTER_METRICS",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "estimator_traits",
    "register_kl_estimator",
    "register_policy_loss",
]

ESTIMATOR_TRAITS = ("needs_values", "needs_baseline")
"""Traits of an advantage estimator: it reads critic values (starts the critic group), or a
per-row reward baseline (ReMax's greedy response score)."""

ADVANTAGE_ESTIMATORS: Registry[Any] = Registry(
    "advantage estimator", trait_names=ESTIMATOR_TRAITS, wrap="flowrl.algos.advantages:Estimator"
)
"""Name -> ``flowrl.algos.advantages.Estimator`` (the function with its traits)."""
_ADV = "flowrl.algos.advantages:"
ADVANTAGE_ESTIMATORS.register("grpo", _ADV + "grpo_advantages", needs_values=False, needs_baseline=False)
ADVANTAGE_ESTIMATORS.register("rloo", _ADV + "rloo_advantages", needs_values=False, needs_baseline=False)
ADVANTAGE_ESTIMATORS.register(
    "reinforce_plus_plus", _ADV + "reinforce_plus_plus_advantages", needs_values=False, needs_baseline=False
)
ADVANTAGE_ESTIMATORS.register("gae", _ADV + "gae_advantages", needs_values=True, needs_baseline=False)
ADVANTAGE_ESTIMATORS.register(
    "reinforce_plus_plus_baseline", _ADV + "reinforce_plus_plus_baseline_advantages",
    needs_values=False, needs_baseline=False,
)
ADVANTAGE_ESTIMATORS.register("remax", _ADV + "remax_advantages", needs_values=False, needs_baseline=True)
ADVANTAGE_ESTIMATORS.register("gpg", _ADV + "gpg_advantages", needs_values=False, needs_baseline=False)
# reads old_logprobs and sum_pi_squared (the actor's pre-update pass computes both for it: graphs/pieces.py)
ADVANTAGE_ESTIMATORS.register("optimal_token_baseline", _ADV + "optimal_token_baseline_advantages",
                              needs_values=False, needs_baseline=False)

POLICY_LOSSES: Registry[Callable] = Registry("policy loss", allow_import_strings=True)
"""Name (or ``package.module:function``) -> ``fn(logp_T, old_logp_T, advantages_T, response_mask_T,
cu_seqlens_B1, **clip) -> (loss_T, stats)``."""
POLICY_LOSSES.register("vanilla", "flowrl.algos.policy_loss:vanilla_policy_loss")
POLICY_LOSSES.register("gspo", "flowrl.algos.policy_loss:gspo_policy_loss")
POLICY_LOSSES.register("geo_mean", "flowrl.algos.policy_loss:geo_mean_policy_loss")
POLICY_LOSSES.register("gpg", "flowrl.algos.policy_loss:gpg_policy_loss")

KL_ESTIMATORS: Registry[Callable] = Registry("KL estimator", allow_import_strings=True)
"""Name (or ``package.module:function``) -> ``fn(logp_T, ref_logp_T) -> kl_T``; ``kl``, ``mse`` and
``low_var_kl`` are verl's names; ``+``: verl's straight-through forms (the value of the estimator,
the gradient of k2)."""
KL_ESTIMATORS.register("k1", "flowrl.algos.kl:kl_k1")
KL_ESTIMATORS.register("kl", "flowrl.algos.kl:kl_k1")
KL_ESTIMATORS.register("abs", "flowrl.algos.kl:kl_abs")
KL_ESTIMATORS.register("k2", "flowrl.algos.kl:kl_k2")
KL_ESTIMATORS.register("k3", "flowrl.algos.kl:kl_k3")
KL_ESTIMATORS.register("mse", "flowrl.algos.kl:kl_k2")
KL_ESTIMATORS.register("low_var_kl", "flowrl.algos.kl:kl_k3")
for _name, _fn in (("k1+", "kl_k1_st"), ("kl+", "kl_k1_st"), ("abs+", "kl_abs_st"), ("k2+", "kl_k2"),
                   ("mse+", "kl_k2"), ("k3+", "kl_k3_st"), ("low_var_kl+", "kl_k3_st")):
    KL_ESTIMATORS.register(_name, f"flowrl.algos.kl:{_fn}")

# Closed sets (names only, no import strings): an aggregation mode's ``counts`` trait sizes the
# global loss denominator that every rank all-reduces, and the KL controllers are verl's two.
AGG_MODES: Registry[Callable] = Registry("loss aggregation mode")
"""Name -> ``fn(masked_T, keep_T, cu_seqlens_B1, max_response_length) -> (total, local count)``;
trait ``counts``: what the denominator counts, ``tokens`` (valid tokens), ``rows`` (rows with a
valid token) or ``nothing`` (``token-sum``: no division)."""
AGG_MODES.register("token-mean", "flowrl.algos.aggregate:token_mean", counts="tokens")
AGG_MODES.register("token-sum", "flowrl.algos.aggregate:token_sum", counts="nothing")
AGG_MODES.register("seq-mean-token-sum", "flowrl.algos.aggregate:seq_mean_token_sum", counts="rows")
AGG_MODES.register("seq-mean-token-mean", "flowrl.algos.aggregate:seq_mean_token_mean", counts="rows")
AGG_MODES.register("seq-mean-token-sum-norm", "flowrl.algos.aggregate:seq_mean_token_sum_norm", counts="rows")

KL_CONTROLLERS: Registry[type] = Registry("KL controller")
"""Name -> controller class of the KL reward penalty's coefficient."""
KL_CONTROLLERS.register("fixed", "flowrl.algos.kl_control:FixedKLController")
KL_CONTROLLERS.register("adaptive", "flowrl.algos.kl_control:AdaptiveKLController")

FILTER_METRICS = ("score", "seq_reward", "seq_final_reward")
"""What must vary within a prompt group for DAPO's dynamic sampling to keep it (experience
columns, see ``flowrl.algos.dapo``)."""


def register_policy_loss(name: str) -> Callable:
    """Decorator: register a policy loss under ``name`` (``actor.policy_loss=name``)."""
    return POLICY_LOSSES.register(name)  # type: ignore[return-value]


def register_kl_estimator(name: str) -> Callable:
    """Decorator: register a KL estimator under ``name`` (``actor.kl_loss_type=name``)."""
    return KL_ESTIMATORS.register(name)  # type: ignore[return-value]


def estimator_traits(name: str) -> dict[str, bool]:
    """``{"needs_values", "needs_baseline"}`` of the estimator ``algorithm.adv_estimator`` names,
    without importing torch for a registered one. ``name`` is a registered name or the import
    string ``package.module:function`` of a function (decorated with ``register_estimator`` for
    traits; an undecorated one needs neither). ValueError as ``resolve_estimator`` raises it."""
    if name in ADVANTAGE_ESTIMATORS or ":" not in name:
        traits = ADVANTAGE_ESTIMATORS.traits(name)
    else:
        obj = import_string(name)  # importing the module runs its @register_estimator decorators
        if not callable(obj):
            raise ValueError(f"{name!r} is not a function; point it at an advantage estimator function")
        traits = {t: getattr(obj, t) for t in ESTIMATOR_TRAITS if hasattr(obj, t)}
        registered = ADVANTAGE_ESTIMATORS.name_of(obj)
        if not traits and registered is not None:  # a built-in named by its import string
            traits = ADVANTAGE_ESTIMATORS.traits(registered)
    return {t: bool(traits.get(t, False)) for t in ESTIMATOR_TRAITS}

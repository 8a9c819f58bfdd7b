"""The checks of ``algorithm.adv_estimator=optimal_token_baseline`` (verl's OTB,
:func:`flowrl.algos.advantages.optimal_token_baseline_advantages`) against the rest of a run, before
any worker starts: what it reads must be computed as verl computes it."""

from __future__ import annotations

from typing import Any

from flowrl.config.errors import check

KEY, VALUE = "algorithm.adv_estimator", "optimal_token_baseline"


def check_otb(cfg: Any) -> None:
    """Raise ``ConfigError`` naming the key and the fix where OTB's inputs cannot be had."""
    from flowrl.catalog.backends import TRAIN_BACKENDS, either

    check("sum_pi_squared" in TRAIN_BACKENDS.spec(cfg.actor.strategy).token_stats, KEY, VALUE,
          "reads sum_pi_squared (sum over the vocabulary of pi**2 at each token) from the actor's pre-update pass, "
          f"which actor.strategy={cfg.actor.strategy} does not compute",
          "use actor.strategy=" + either(TRAIN_BACKENDS.names_where(lambda s: "sum_pi_squared" in s.token_stats)))
    check(not cfg.algorithm.rollout_is_bypass, KEY, VALUE, "reads the pre-update pass's log-probs and sum_pi_squared, "
          "which bypass mode (algorithm.rollout_is_bypass) skips", "set algorithm.rollout_is_bypass=false")
    check(not cfg.algorithm.rollout_is, KEY, VALUE, "with algorithm.rollout_is=true verl scales W by the squared "
          "importance weights, which flowrl computes after the advantages (not built)",
          "set algorithm.rollout_is=false (the rollout_corr/* metrics stay with rollout_is_threshold)")

"""The checks of the rollout correction's bypass mode and rejection sampling
(``algorithm.rollout_is_bypass``, ``rollout_is_loss_type``, ``rollout_is_batch_normalize``,
``rollout_rs``, ``rollout_rs_threshold``): verl's values, refused before any worker starts with
the key, the value and the fix. The math is :mod:`flowrl.algos.rollout_correction`'s."""

from __future__ import annotations

from typing import Any

from flowrl.config.errors import check, check_one_of


def check_bypass(algo: Any) -> None:
    """Raise ``ConfigError`` for a bypass-mode setting that cannot run (``algo``: the algorithm section)."""
    from flowrl.algos.rollout_thresholds import LOSS_TYPES, parse_rs_thresholds

    check_one_of("rollout_is_loss_type", algo.rollout_is_loss_type, LOSS_TYPES)
    bypass_only = (("rollout_is_batch_normalize", algo.rollout_is_batch_normalize, False),
                   ("rollout_rs", algo.rollout_rs, None), ("rollout_is_loss_type", algo.rollout_is_loss_type, "ppo_clip"))
    for key, value, off in bypass_only:
        check(algo.rollout_is_bypass or value == off, key, value,
              "is built for bypass mode only (verl's decoupled mode with it is not built in flowrl)",
              f"set algorithm.rollout_is_bypass=true, or {key}={off if off is not None else 'null'}")
    if algo.rollout_rs is not None:
        try:
            parse_rs_thresholds(algo.rollout_rs, algo.rollout_rs_threshold)
        except ValueError as exc:
            key = "rollout_rs" if "unknown option" in str(exc) else "rollout_rs_threshold"
            value = algo.rollout_rs if key == "rollout_rs" else algo.rollout_rs_threshold
            check(False, key, value, str(exc), "see verl's rollout_corr_helper: e.g. rollout_rs=token_k1 with "
                  "rollout_rs_threshold=0.5_2.0, or seq_max_k2 with 2.5")
    if not algo.rollout_is_bypass:
        return
    if algo.rollout_is:
        check_one_of("rollout_is_level", algo.rollout_is_level, ("token", "sequence"))
        check(algo.rollout_is_veto_threshold is None, "rollout_is_veto_threshold", algo.rollout_is_veto_threshold,
              "is decoupled mode's veto; bypass mode rejects with rollout_rs", "use rollout_rs=token_k1 with its bounds")
    check(algo.rollout_is or not algo.rollout_is_batch_normalize, "rollout_is_batch_normalize",
          algo.rollout_is_batch_normalize, "normalizes importance weights, and algorithm.rollout_is is off",
          "set rollout_is=true with rollout_is_threshold, or rollout_is_batch_normalize=false")


def bypass_settings(algo: Any) -> dict | None:
    """The actor's bypass-mode loss settings (``flowrl.algos.rollout_correction.Bypass``'s fields;
    ``rollout_is_mode=mask``: verl's IcePop bounds), or None outside bypass mode."""
    if not algo.rollout_is_bypass:
        return None
    threshold: str | float = algo.rollout_is_threshold if algo.rollout_is_threshold is not None else 2.0
    if algo.rollout_is and algo.rollout_is_mode == "mask":  # IcePop: weights outside [lower, upper] zeroed
        lower = algo.rollout_is_threshold_lower or 1.0 / float(threshold)
        threshold = f"{lower}_{threshold}"
    return {"loss_type": algo.rollout_is_loss_type, "level": algo.rollout_is_level if algo.rollout_is else None,
            "threshold": threshold, "batch_normalize": algo.rollout_is_batch_normalize,
            "rs": algo.rollout_rs, "rs_threshold": algo.rollout_rs_threshold}

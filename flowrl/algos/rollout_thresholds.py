"""verl's thresholds of the rollout correction (``rollout_is_threshold``, ``rollout_rs``,
``rollout_rs_threshold``) parsed as verl 0.9.1's ``rollout_corr_helper`` parses them; torch-free, so
the config checks them before any worker starts (:mod:`flowrl.config.rollout_bypass`)."""

from __future__ import annotations

RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
"""verl 0.9.1's rejection-sampling options (``SUPPORTED_ROLLOUT_RS_OPTIONS``)."""
LOSS_TYPES = ("ppo_clip", "reinforce")


def parse_is_threshold(spec: str | float) -> tuple[float, float | None]:
    """``(upper, lower)`` of verl's ``rollout_is_threshold``: a float (TIS: lower None) or
    ``"lower_upper"`` (IcePop). ValueError naming the fix on anything else."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"rollout_is_threshold must be a float or 'lower_upper', got {spec!r}")
    text = str(spec).strip()
    lower: float | None = None
    try:
        if "_" in text:
            low_text, up_text = text.split("_", 1)
            lower, upper = float(low_text), float(up_text)
        else:
            upper = float(text)
    except ValueError:
        raise ValueError(f"rollout_is_threshold {spec!r} is not a float or 'lower_upper' (e.g. 2.0, '0.5_2.0')") from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"rollout_is_threshold {spec!r}: bounds must be positive with lower <= upper")
    return upper, lower


def parse_rs_thresholds(rs: str, spec: str | float | None) -> dict[str, tuple[float | None, float]]:
    """verl's ``rollout_rs`` (comma list) and ``rollout_rs_threshold`` (one spec shared by all, or
    one per option, comma separated) as ``{option: (lower, upper)}``: k1 options take ``l_u`` (or
    ``u`` alone, ``l = 1/u``), the others one upper bound. ValueError naming the fix otherwise."""
    options = list(dict.fromkeys(o.strip() for o in str(rs).split(",") if o.strip()))
    bad = [o for o in options if o not in RS_OPTIONS]
    if not options or bad:
        raise ValueError(f"rollout_rs {rs!r}: unknown option(s) {bad}; use a comma list of {', '.join(RS_OPTIONS)}")
    if spec is None or isinstance(spec, bool):
        raise ValueError(f"rollout_rs={rs!r} needs rollout_rs_threshold (e.g. '0.5_2.0' for k1, 2.5 for k2/k3)")
    specs = [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(specs) not in (1, len(options)):
        raise ValueError(f"rollout_rs_threshold {spec!r}: give one threshold for all of {options} or one each")
    specs = specs * len(options) if len(specs) == 1 else specs
    out: dict[str, tuple[float | None, float]] = {}
    for option, text in zip(options, specs):
        try:
            if option.endswith("k1"):
                low_text, _, up_text = text.rpartition("_") if "_" in text else ("", "", text)
                upper = float(up_text)
                lower = float(low_text) if low_text else 1.0 / upper
            elif "_" in text:
                raise ValueError
            else:
                lower, upper = None, float(text)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"rollout_rs_threshold {text!r} for {option}: k1 options take 'lower_upper' or one "
                             "positive float, the others one positive float") from None
        if upper <= 0 or (lower is not None and not 0 < lower <= upper):
            raise ValueError(f"rollout_rs_threshold {text!r} for {option}: bounds must be positive with lower <= upper")
        out[option] = (lower, upper)
    return out

"""verl's rollout keys that several values, or a whole sub-tree, make together (``derive`` entries of
:mod:`flowrl.config.verl_keys_rollout`, read by :func:`flowrl.config.verl.derive`):

* the multi-turn caps: verl's tool agent loop ends a trajectory once its assistant turns reach
  ``max_assistant_turns``, or once its user (tool-answer) turns reach ``max_user_turns`` (``U``: the
  model turn that follows the U-th tool answer is the last, so U + 1 model turns); flowrl's
  ``rollout.multi_turn.max_turns`` counts model turns the same way (:mod:`flowrl.agents.loop`), so it
  is the smaller of ``max_assistant_turns`` and ``max_user_turns + 1``. ``null`` or 0 is no cap, as in
  verl; with neither cap a multi-turn run's turns are bounded by its response length only, which is
  flowrl's ``max_turns`` at that length (every model turn takes at least one of its tokens);
* ``engine_kwargs.vllm.*``: flowrl's ``rollout.engine_kwargs.*`` (passed to ``vllm.LLM`` last).
"""

from __future__ import annotations

from typing import Any

from flowrl.config.errors import ConfigError
from flowrl.config.verl_names import AR

__all__ = ["turn_caps", "vllm_engine_kwargs"]

_MT = f"{AR}.rollout.multi_turn"
_VLLM = f"{AR}.rollout.engine_kwargs.vllm"
VERL_RESPONSE_LENGTH = 512
"""verl's ``data.max_response_length`` default (the response length its rollout reads)."""


def turn_caps(flat: dict[str, Any]) -> dict[str, Any]:
    """``rollout.multi_turn.max_turns`` of verl's ``max_assistant_turns`` and ``max_user_turns``
    (see the module docstring); nothing when neither cap is given and multi-turn is off."""
    caps = []
    for name, extra_turn in (("max_assistant_turns", 0), ("max_user_turns", 1), ("max_turns", 0)):  # max_turns: verl 0.4
        value = flat.get(f"{_MT}.{name}")
        if value in (None, 0, "", "null", "None"):
            continue  # verl: no cap
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{_MT}.{name}", value, "must be a whole number of turns >= 0 (0 or null: no cap)",
                              f"set {_MT}.{name}=null, or e.g. 4")
        caps.append(value + extra_turn)
    if caps:
        return {"rollout.multi_turn.max_turns": min(caps)}
    enabled = any(str(flat.get(key)).lower() == "true" for key in (f"{_MT}.enable", "rollout.multi_turn.enable"))
    return {"rollout.multi_turn.max_turns": _response_length(flat)} if enabled else {}


def _response_length(flat: dict[str, Any]) -> int:
    """The rollout's response length among the keys that set it (verl's default if none does)."""
    lengths = [flat.get(key) for key in (f"{AR}.rollout.response_length", "data.max_response_length",
                                         "rollout.response_length")]
    lengths = [v for v in lengths if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return max(lengths) if lengths else VERL_RESPONSE_LENGTH


def vllm_engine_kwargs(flat: dict[str, Any]) -> dict[str, Any]:
    """verl's ``engine_kwargs.vllm.<name>`` as flowrl's ``rollout.engine_kwargs.<name>`` (a whole
    ``engine_kwargs.vllm`` mapping too, as a verl YAML may hold it)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if key == _VLLM and isinstance(value, dict):
            out.update({f"rollout.engine_kwargs.{name}": v for name, v in value.items()})
        elif key.startswith(_VLLM + "."):
            out[f"rollout.engine_kwargs.{key[len(_VLLM) + 1:]}"] = value
    return out

"""verl's reward manager (``reward_model.reward_manager``, ``reward.reward_manager.name``) and the
DAPO manager's ``reward_model.reward_kwargs``, as flowrl settings (:func:`reward_manager`, read by
:func:`flowrl.config.verl.derive`).

verl 0.9.1's ``naive`` manager scores each response with the reward function: flowrl's reward stage
(``algorithm.reward_fn``). Its ``dapo`` manager does the same, then, with
``reward_kwargs.overlong_buffer_cfg.enable``, adds DAPO's soft overlong penalty
``min(-(length - (max_resp_len - len)) / len * penalty_factor, 0)`` to the reward (length in tokens,
EOS counted; ``verl/experimental/reward_loop/reward_manager/dapo.py``): flowrl's
``reward_model.overlong_buffer.*`` (:func:`flowrl.algos.dapo.overlong_penalty`), whose budget is
``rollout.response_length``, so ``max_resp_len`` must be that. Other managers (``prime``,
``batch``, ``gdpo``, ``limited``, ``remote``, a registered one of your own) are refused by name.
"""

from __future__ import annotations

from typing import Any

from flowrl.config.errors import ConfigError

__all__ = ["reward_manager"]

KWARGS = "reward_model.reward_kwargs."
BUFFER = KWARGS + "overlong_buffer_cfg."
#: verl's ``overlong_buffer_cfg`` fields -> flowrl's ``reward_model.overlong_buffer`` fields
BUFFER_FIELDS = ("enable", "len", "penalty_factor")
_OFF = (None, "", "null", "none", "None")


def reward_manager(flat: dict[str, Any]) -> dict[str, Any]:
    """The flowrl keys of verl's reward manager and its ``reward_kwargs`` in ``flat`` (verl keys):
    nothing for ``naive`` (flowrl's reward stage), ``reward_model.overlong_buffer.*`` for ``dapo``;
    :class:`ConfigError` naming what flowrl lacks otherwise."""
    name = flat.get("reward_model.reward_manager")
    key = "reward_model.reward_manager"
    if name in _OFF:
        name, key = flat.get("reward.reward_manager.name"), "reward.reward_manager.name"
    name = "naive" if name in _OFF else str(name)
    given = sorted(k for k in flat if k.startswith(BUFFER) or k == KWARGS + "max_resp_len")
    if name == "naive":
        if given:
            raise ConfigError(given[0], flat[given[0]], "in verl: read by the dapo reward manager only (the naive "
                              "manager leaves them unused)", f"set {key}=dapo for DAPO's overlong penalty, or drop it")
        return {}
    if name != "dapo":
        raise ConfigError(key, name, f"in verl: the {name} reward manager; flowrl has no equivalent (flowrl "
                          "has naive's and dapo's)", "drop it (naive: algorithm.reward_fn scores each response); "
                          "nearest flowrl setting: algorithm.reward_fn; reward_model.overlong_buffer.*")
    return _overlong_buffer(flat)


def _overlong_buffer(flat: dict[str, Any]) -> dict[str, Any]:
    """The dapo manager's ``overlong_buffer_cfg`` as ``reward_model.overlong_buffer.*``; its
    ``max_resp_len`` must be the response budget flowrl's penalty counts from."""
    if not _true(flat.get(BUFFER + "enable")):
        return {}
    out = {f"reward_model.overlong_buffer.{name}": flat[BUFFER + name] for name in BUFFER_FIELDS
           if flat.get(BUFFER + name) not in _OFF}
    budget = flat.get("actor_rollout_ref.rollout.response_length")
    budget = budget if budget not in _OFF else flat.get("data.max_response_length", 512)
    limit = flat.get(KWARGS + "max_resp_len")
    if limit in _OFF:
        raise ConfigError(KWARGS + "max_resp_len", limit, "is needed by verl's dapo manager with "
                          "overlong_buffer_cfg.enable=true (verl stops on it too)", f"set it to {budget}, "
                          "the response length")
    if int(limit) != int(budget):
        raise ConfigError(KWARGS + "max_resp_len", limit, f"in verl: an overlong budget other than the response "
                          f"length ({budget}); flowrl has no equivalent (its penalty counts from "
                          "rollout.response_length)", f"set it to {budget}")
    return out


def _true(value: Any) -> bool:
    return str(value).lower() in ("true", "1")

"""Metric keys grouped the way verl's loggers show them: by the prefix before the first ``/``.

verl's names (``actor/pg_loss``, ``critic/score/mean``, ``timing_s/gen``, ``perf/throughput``,
``response_length/mean``, ``val-core/<source>/reward/mean``, ...) land in wandb/TensorBoard
sections named by that prefix; the dashboard shows the same sections, in the order an RL
engineer reads them (reward first, then the policy update, lengths, time, throughput). Keys
without a ``/`` (``num_tokens``) go to ``misc``. Pure functions, no I/O.
"""

from __future__ import annotations

from typing import Iterable

from flowrl.metrics import names

#: Section order; prefixes not listed follow in alphabetical order, then ``misc``.
GROUP_ORDER = (
    "critic", "reward", "val-core", "val-aux", "actor", "rollout", "response_length", "prompt_length",
    "timing_s", "timing_per_token_ms", "compute_s", "perf", "reshard", "training",
)
MISC = "misc"
#: Sections that also have their own dashboard panel.
THROUGHPUT_GROUP = names.PERF_GROUP
RESHARD_GROUP = names.RESHARD_GROUP


def metric_group(key: str) -> str:
    """``"actor/pg_loss"`` -> ``"actor"``; ``"num_tokens"`` -> ``"misc"``."""
    prefix, sep, rest = key.partition("/")
    return prefix if sep and prefix and rest else MISC


def _rank(group: str) -> tuple[int, str]:
    if group in GROUP_ORDER:
        return (0, f"{GROUP_ORDER.index(group):03d}")
    return (2, "") if group == MISC else (1, group)


def group_metrics(keys: Iterable[str]) -> dict[str, list[str]]:
    """Section -> its keys (sorted), sections in :data:`GROUP_ORDER`; ``step`` is not a metric.

    >>> group_metrics(["num_tokens", "actor/pg_loss", "critic/score/mean", "actor/entropy", "step"])
    {'critic': ['critic/score/mean'], 'actor': ['actor/entropy', 'actor/pg_loss'], 'misc': ['num_tokens']}
    """
    groups: dict[str, list[str]] = {}
    for key in sorted(set(keys)):
        if key == "step":
            continue
        groups.setdefault(metric_group(key), []).append(key)
    return {g: groups[g] for g in sorted(groups, key=_rank)}


def keys_of(group: str, keys: Iterable[str]) -> list[str]:
    """The keys of one section (e.g. ``perf`` for the throughput panel), sorted."""
    return sorted(k for k in set(keys) if k != "step" and metric_group(k) == group)


def headline_keys(keys: Iterable[str]) -> list[str]:
    """The overview row: reward, KL, entropy, clip fraction, response length, throughput (those
    present), as an RL engineer checks them first."""
    present = set(keys)
    wanted = (names.SCORE_MEAN, names.ACTOR_PPO_KL, names.ACTOR_KL_LOSS, names.ACTOR_ENTROPY, names.ACTOR_PG_CLIPFRAC,
              names.RESPONSE_LENGTH_MEAN, names.THROUGHPUT, names.STEP_TIME)
    return [k for k in wanted if k in present]

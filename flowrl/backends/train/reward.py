"""Which reward-model engine (the ``rm`` family) a train backend has, torch-free: the engines of
``dp_reward`` / ``fsdp_reward`` / ``megatron/reward`` by ``actor.strategy``, imported only when
chosen, and the keyword arguments each takes from the actor's config."""

from __future__ import annotations

from typing import Any

from flowrl.registry import import_string

REWARD_ENGINES = {
    "dp": "flowrl.backends.train.dp_reward:TorchDPRewardEngine",
    "fsdp": "flowrl.backends.train.fsdp_reward:FSDPRewardEngine",
    "megatron": "flowrl.backends.train.megatron.reward:MegatronRewardTrainEngine",
}
"""``actor.strategy`` -> its reward-model engine class."""



def reward_engine(strategy: str) -> str:
    """The import string of ``strategy``'s reward-model engine; ValueError naming the valid ones."""
    if strategy not in REWARD_ENGINES:
        raise ValueError(f"actor.strategy={strategy!r} has no reward-model engine yet (the rm family); use one of "
                         f"{', '.join(REWARD_ENGINES)}")
    return REWARD_ENGINES[strategy]


def reward_engine_class(strategy: str) -> type:
    return import_string(reward_engine(strategy))


def reward_engine_kwargs(actor: Any) -> dict:
    """The reward engine's keyword arguments from ``actor`` (megatron: its mesh and distributed
    optimizer; the policy's engine arguments otherwise)."""
    from flowrl.catalog.backends import TRAIN_BACKENDS

    if actor.strategy == "megatron":
        from flowrl.backends.train.megatron.options import train_engine_kwargs

        out = train_engine_kwargs(actor)
        out.pop("offload", None)  # never generates: nothing to offload between phases (refused by the rm family)
        return out
    fn = TRAIN_BACKENDS.spec(actor.strategy).engine_kwargs
    return import_string(fn)(actor) if fn else {}

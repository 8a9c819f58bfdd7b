"""Which reward-model engine (the ``rm`` family) a train backend has, torch-free: the engines of
``dp_reward`` / ``fsdp_reward`` by ``actor.strategy``, imported only when chosen."""

from __future__ import annotations

from flowrl.registry import import_string

REWARD_ENGINES = {
    "dp": "flowrl.backends.train.dp_reward:TorchDPRewardEngine",
    "fsdp": "flowrl.backends.train.fsdp_reward:FSDPRewardEngine",
}
"""``actor.strategy`` -> its reward-model engine class (megatron and LoRA have none yet)."""


def reward_engine(strategy: str) -> str:
    """The import string of ``strategy``'s reward-model engine; ValueError naming the valid ones."""
    if strategy not in REWARD_ENGINES:
        raise ValueError(f"actor.strategy={strategy!r} has no reward-model engine yet (the rm family); use one of "
                         f"{', '.join(REWARD_ENGINES)}")
    return REWARD_ENGINES[strategy]


def reward_engine_class(strategy: str) -> type:
    return import_string(reward_engine(strategy))

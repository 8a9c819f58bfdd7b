"""Typed run configuration: dataclasses, YAML + dotted overrides, validation.

Importing it imports no torch: names of algorithms and backends are checked against the
registries (``flowrl.catalog.algos``, ``flowrl.catalog.backends``).
"""

from flowrl.config.algorithm import AlgorithmConfig, FilterGroupsConfig, KLCtrlConfig
from flowrl.config.cluster import ClusterConfig, PoolConfig, SlurmConfig
from flowrl.config.errors import ConfigError
from flowrl.config.loader import dump_config, load_config, to_dict
from flowrl.config.roles import (
    ActorConfig,
    CriticConfig,
    OverlongBufferConfig,
    ReferenceConfig,
    RewardModelConfig,
    RolloutConfig,
    ValKwargsConfig,
)
from flowrl.config.schema import RunConfig
from flowrl.config.sections import DataConfig, ModelConfig, OptimConfig, TrainerConfig

__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "ClusterConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "FilterGroupsConfig",
    "KLCtrlConfig",
    "ModelConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "PoolConfig",
    "ReferenceConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RunConfig",
    "SlurmConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "dump_config",
    "load_config",
    "to_dict",
]

"""Typed run configuration: dataclasses, YAML + dotted overrides, validation."""

from flowrl.config.errors import ConfigError
from flowrl.config.loader import dump_config, load_config, to_dict
from flowrl.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    ClusterConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    ReferenceConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
)

__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "ReferenceConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainerConfig",
    "dump_config",
    "load_config",
    "to_dict",
]

"""Pre-flight checks of the chosen backends, on the driver, before any worker starts.

Driven by the specs of :mod:`flowrl.catalog.backends`, so nothing here names a backend: each
backend's own ``preflight`` function checks its layouts against the model (and that its package
is installed), its ``checkpoint_blockers`` (and optional ``checkpointable`` function) say when its
state cannot be checkpointed, and a value backend without a ``checkpoint`` kind refuses critic
checkpoints. For the defaults (``dp``,
``hf``) nothing is imported beyond the registry.
"""

from __future__ import annotations

from typing import Any

from flowrl.catalog.backends import GEN_BACKENDS, TRAIN_BACKENDS, VALUE_BACKENDS, checkpoint_problem
from flowrl.config import ConfigError, RunConfig
from flowrl.registry import import_string

__all__ = ["check_backends", "check_checkpointable", "check_model_options", "check_rollout_backend"]


def _call(path: str | None, *args: Any, **kwargs: Any) -> Any:
    return None if path is None else import_string(path)(*args, **kwargs)


def check_backends(cfg: RunConfig, *, model_path: str) -> None:
    """Every pre-flight check of ``cfg``'s backends against the model in ``model_path``:
    the actor's (and reference's) layout, the critic's layout and checkpoint support, the
    checkpoints ``trainer.save_freq`` asks for, the generation backend's installation. Raises
    :class:`~flowrl.config.ConfigError` naming the key, the value and the fix."""
    _call(TRAIN_BACKENDS.spec(cfg.actor.strategy).preflight, cfg, model_path=model_path)
    check_model_options(cfg, model_path=model_path)
    _call("flowrl.backends.train.ulysses_options:check_model", cfg, model_path=model_path)  # Ulysses: heads / sp
    if cfg.needs_critic:
        _check_critic(cfg, cfg.critic.model_path or model_path)
    if cfg.trainer.save_freq > 0:
        check_checkpointable(cfg, "trainer.save_freq", cfg.trainer.save_freq)
    check_rollout_backend(cfg.rollout, model_path=model_path)


def check_model_options(cfg: RunConfig, *, model_path: str | None = None) -> None:
    """``model.*`` options the chosen backend does not build are refused: LoRA (backends without a
    ``lora`` check in their spec; with one, its check of ``model.target_modules`` against ``model_path``),
    gradient checkpointing (backends whose spec has no ``model_kwargs``)."""
    m, spec = cfg.model, TRAIN_BACKENDS.spec(cfg.actor.strategy)
    if m.lora_rank > 0:
        if not spec.trains_adapters:
            raise ConfigError("model.lora_rank", m.lora_rank, f"actor.strategy={cfg.actor.strategy} does not build LoRA",
                              "set actor.strategy=fsdp (or dp), or model.lora_rank=0")
        _call(spec.lora, cfg, model_path=model_path)
    if m.enable_gradient_checkpointing and spec.model_kwargs is None:
        raise ConfigError("model.enable_gradient_checkpointing", True,
                          f"actor.strategy={cfg.actor.strategy} does not take it",
                          "set actor.strategy=fsdp, or model.enable_gradient_checkpointing=false")


def check_checkpointable(cfg: RunConfig, key: str, value: Any) -> None:
    """Refuse, as a mistake in ``key`` (= ``value``), a run whose actor state cannot be
    checkpointed (``trainer.save_freq`` > 0, or resuming: ``trainer.resume_mode``)."""
    spec = TRAIN_BACKENDS.spec(cfg.actor.strategy)
    problem = checkpoint_problem(spec, cfg.actor) or _call(spec.checkpointable, cfg.actor)
    if problem is not None:
        reason, fix = problem
        raise ConfigError(key, value, reason, fix)


def check_rollout_backend(rollout: Any, *, model_path: str | None = None) -> None:
    """The generation backend ``rollout.name`` is installed and usable here (a ``RolloutConfig``),
    and, given ``model_path``, runs that model (e.g. its attention head size)."""
    _call(GEN_BACKENDS.spec(rollout.name).preflight, rollout, model_path=model_path)


def _check_critic(cfg: RunConfig, model_path: str) -> None:
    """The critic's backend: checkpoints (when it has none yet: no ``trainer.save_freq`` and no
    resume path) and its own checks against the critic's model."""
    name = cfg.critic.strategy
    spec = VALUE_BACKENDS.spec(name)
    if spec.checkpoint is None:
        if cfg.trainer.save_freq > 0:
            raise ConfigError("trainer.save_freq", cfg.trainer.save_freq, f"with critic.strategy={name}: critic "
                              f"checkpoints are not supported for the {name} critic yet",
                              "set trainer.save_freq=0, or critic.strategy=dp")
        if cfg.trainer.resume_mode not in ("auto", "disable"):
            raise ConfigError("trainer.resume_mode", cfg.trainer.resume_mode, f"with critic.strategy={name}: "
                              f"the {name} critic cannot be restored from a checkpoint yet",
                              "set trainer.resume_mode=disable, or critic.strategy=dp")
    _call(spec.preflight, cfg, model_path=model_path)

"""Pre-flight checks for the models that score a vision-language policy's samples: the PPO critic
and the reward model (``reward_model.enable``), refused on the driver before any worker starts
(``flowrl.run.preflight``, after :func:`flowrl.config.vlm_checks.check_vlm`).

The critic of a VLM is the VLM's backbone with a value head (:mod:`flowrl.models.vlm_value`):
its values are computed with the images, through the policy's own VLM forward, in the value
engines built on a train engine that builds a VLM (``dp``, ``fsdp``: ``TorchDPValueEngine`` and
``FSDPValueEngine`` run ``TorchDPEngine._hidden``). So a critic strategy takes a VLM when the train
backend of the same name does (its spec's ``vision_language``); megatron's value engine builds no
vision tower. Refused too: Ulysses sequence parallelism in the critic (it does not split image
features), and a text critic (``critic.model_path``) on a VLM policy or a VLM critic on a text one.

The reward model (``flowrl.roles.reward_model``) scores the ids alone with a sequence-classification
head: a VLM reward model is not built, and a text one on a VLM policy would read the
``<|image_pad|>`` tokens without the picture.
"""

from __future__ import annotations

from typing import Any

from flowrl.catalog.backends import VALUE_BACKENDS, either
from flowrl.config.errors import ConfigError

__all__ = ["check_vlm_critic", "check_vlm_reward_model", "check_vlm_scorers", "critic_takes_images"]


def critic_takes_images(strategy: str) -> bool:
    """Whether the value backend ``strategy`` computes a VLM's values with its images (its spec's
    ``vision_language``)."""
    return strategy in VALUE_BACKENDS.names() and VALUE_BACKENDS.spec(strategy).vision_language


def check_vlm_scorers(cfg: Any, *, model_path: str) -> None:
    """Raise :class:`ConfigError` for a critic or reward model that cannot score ``model_path``'s
    samples (a VLM's, or a text model's with a VLM scorer); nothing otherwise."""
    check_vlm_critic(cfg, model_path=model_path)
    check_vlm_reward_model(cfg, model_path=model_path)


def check_vlm_critic(cfg: Any, *, model_path: str) -> None:
    """The critic (``algorithm.adv_estimator=gae``) of a VLM: a strategy that takes the images,
    no sequence parallelism, and a VLM itself."""
    from flowrl.models.vlm_config import is_vlm_dir

    if not cfg.needs_critic:
        return
    critic = cfg.critic
    policy_vlm = is_vlm_dir(model_path)
    critic_path = critic.model_path or model_path
    critic_vlm = policy_vlm if not critic.model_path else is_vlm_dir(critic_path)
    if critic.model_path and policy_vlm != critic_vlm:
        kinds = ("a vision-language model", "a text model")
        raise ConfigError("critic.model_path", critic.model_path,
                          f"is {kinds[not critic_vlm]} while model.path={model_path} is {kinds[not policy_vlm]}: "
                          "the critic must read the policy's prompts as the policy does (with their images or without)",
                          "point critic.model_path at a model of the policy's kind, or leave it empty (the policy's model)")
    if not critic_vlm:
        return
    what = f"the critic's model {critic_path} is a vision-language model"
    if not critic_takes_images(critic.strategy):
        takers = either(VALUE_BACKENDS.names_where(lambda s: critic_takes_images(s.name)))
        raise ConfigError("critic.strategy", critic.strategy, f"{what}, which the {critic.strategy} value backend does "
                          "not build (no vision tower: its values would ignore the images)", f"set critic.strategy={takers}")
    sp = critic.ulysses_sequence_parallel_size
    if sp != 1:
        raise ConfigError("critic.ulysses_sequence_parallel_size", sp, f"{what}; Ulysses sequence parallelism does "
                          "not split image features", "set critic.ulysses_sequence_parallel_size=1")


def check_vlm_reward_model(cfg: Any, *, model_path: str) -> None:
    """``reward_model.enable`` with a VLM policy or a VLM reward model: refused (it scores ids only)."""
    from flowrl.models.vlm_config import is_vlm_dir

    rm = cfg.reward_model
    if not rm.enable:
        return
    fix = "set reward_model.enable=false and score with algorithm.reward_fn (a rule on the decoded response)"
    if is_vlm_dir(rm.model_path):
        raise ConfigError("reward_model.model_path", rm.model_path, "is a vision-language model; the reward model "
                          "is a sequence classifier on a text model's ids (flowrl.roles.reward_model), no VLM "
                          "reward model is built", fix)
    if is_vlm_dir(model_path):
        raise ConfigError("reward_model.enable", True, f"model.path={model_path} is a vision-language model; the reward "
                          "model scores the token ids alone and would read the <|image_pad|> tokens without the "
                          "picture", fix)

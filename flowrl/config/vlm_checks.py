"""Pre-flight checks for a vision-language ``model.path`` (Qwen2-VL / Qwen2.5-VL): what flowrl runs
one with, refused on the driver before any worker starts (``flowrl.run.preflight``).

A VLM trains in a strategy whose spec says ``vision_language`` (``dp``, ``fsdp``) and runs only
where the generator decodes with the trainer's own module (``whole_module``: ``dp``; ``fsdp``'s
engine computes it too, but a run would sync its weights to the generator by a reshard that knows
text models' names only), with a generation backend that ``takes_images`` (``hf``) in the same
processes (:mod:`flowrl.backends.vlm`); megatron does not build its vision tower, the vLLM
backend is not fed the images, multi-turn rollouts and Ulysses sequence parallelism do not carry
them, and a critic or reward model on it would read the ``<|image_pad|>`` tokens without the picture.
"""

from __future__ import annotations

from typing import Any

from flowrl.catalog.backends import GEN_BACKENDS, TRAIN_BACKENDS, either
from flowrl.config.errors import ConfigError


def check_vlm(cfg: Any, *, model_path: str) -> None:
    """Raise :class:`ConfigError` when ``model_path`` is a vision-language model and the config
    asks for something flowrl does not run one with; nothing for a text model."""
    from flowrl.models.vlm_config import is_vlm_dir

    if not is_vlm_dir(model_path):
        return
    what = f"model.path={model_path} is a vision-language model"
    builders = either(TRAIN_BACKENDS.names_where(lambda s: s.vision_language))
    for section in ("actor", "ref"):
        strategy = getattr(getattr(cfg, section, None), "strategy", None)
        if strategy is not None and not TRAIN_BACKENDS.spec(strategy).vision_language:
            raise ConfigError(f"{section}.strategy", strategy, f"{what}, which the {strategy} strategy does not build "
                              "(no vision tower)", f"set {section}.strategy={builders}")
    if not TRAIN_BACKENDS.spec(cfg.actor.strategy).whole_module:  # fsdp: its engine computes a VLM exactly
        # (tests/dist/test_vlm_fsdp.py), but the hybrid group's generator then gets the weights by a reshard, whose
        # layouts know a text model's names only
        whole = either(TRAIN_BACKENDS.names_where(lambda s: s.vision_language and s.whole_module))
        raise ConfigError("actor.strategy", cfg.actor.strategy, f"{what}; a run syncs weights to the generator by "
                          "reshard for this strategy, which does not carry a VLM's vision tower and names yet",
                          f"set actor.strategy={whole} (the generator then uses the trainer's module itself)")
    if not GEN_BACKENDS.spec(cfg.rollout.name).takes_images:
        raise ConfigError("rollout.name", cfg.rollout.name, f"{what}; this generation backend is not given the "
                          "images", f"set rollout.name={either(GEN_BACKENDS.names_where(lambda s: s.takes_images))}")
    if cfg.rollout.multi_turn.enable:
        raise ConfigError("rollout.multi_turn.enable", True, f"{what}; multi-turn rollouts do not carry images",
                          "set rollout.multi_turn.enable=false")
    from flowrl.config.pools import resolve_placement

    placement, why = resolve_placement(cfg)
    if placement != "hybrid":
        raise ConfigError("cluster.placement", cfg.cluster.placement, f"{what}; it runs only with cluster.placement="
                          f"hybrid (the generator uses the trainer's own module), this run's is {placement}"
                          f"{f' ({why})' if why else ''}: the weight sync (reshard) does not carry the vision tower",
                          "set cluster.placement=hybrid (or auto) with a hybrid-capable layout")
    sp = getattr(cfg.actor, "ulysses_sequence_parallel_size", 1)
    if sp != 1:
        raise ConfigError("actor.ulysses_sequence_parallel_size", sp, f"{what}; Ulysses sequence parallelism does "
                          "not split image features", "set actor.ulysses_sequence_parallel_size=1")

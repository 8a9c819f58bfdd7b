"""Pre-flight checks for a vision-language ``model.path`` (Qwen2-VL / Qwen2.5-VL): what flowrl runs
one with, refused on the driver before any worker starts (``flowrl.run.preflight``).

A VLM trains in a strategy whose spec says ``vision_language`` (``dp``, ``fsdp``), with a
generation backend that ``takes_images`` (``hf``: :mod:`flowrl.backends.vlm`; ``vllm``:
:mod:`flowrl.backends.generate.vllm_images`), in any placement. The generator decodes with the
trainer's own module (``whole_module``: ``dp`` in the hybrid placement) or gets the weights by a
reshard of whole parameters under their HF names, vision tower included (an ``hf``-layout trainer,
``dp`` or ``fsdp``, into the ``hf`` generator at tp = 1, or into vLLM's staging layout at any tp,
whose engine rank loads the whole tensors: ``flowrl.parallel.named_spec``). Refused: megatron (it
does not build the vision tower); the ``hf`` generator at tp > 1; multi-turn rollouts, partial
rollouts and Ulysses sequence parallelism (they do not carry the images).
"""

from __future__ import annotations

from typing import Any

from flowrl.catalog.backends import GEN_BACKENDS, TRAIN_BACKENDS, ShardStyle, either
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
    if not GEN_BACKENDS.spec(cfg.rollout.name).takes_images:
        raise ConfigError("rollout.name", cfg.rollout.name, f"{what}; this generation backend is not given the images",
                          f"set rollout.name={either(GEN_BACKENDS.names_where(lambda s: s.takes_images))}")
    _check_weight_sync(cfg, what)
    if cfg.rollout.multi_turn.enable:
        raise ConfigError("rollout.multi_turn.enable", True, f"{what}; multi-turn rollouts do not carry images",
                          "set rollout.multi_turn.enable=false")
    if cfg.trainer.partial_rollout:  # flowrl.roles.partial continues a response from its ids alone
        raise ConfigError("trainer.partial_rollout", True, f"{what}; partial rollouts continue each response "
                          "without its prompt's images", "set trainer.partial_rollout=false")
    sp = getattr(cfg.actor, "ulysses_sequence_parallel_size", 1)
    if sp != 1:
        raise ConfigError("actor.ulysses_sequence_parallel_size", sp, f"{what}; Ulysses sequence parallelism does "
                          "not split image features", "set actor.ulysses_sequence_parallel_size=1")


def _check_weight_sync(cfg: Any, what: str) -> None:
    """The trainer's weights reach the generator: it decodes with the trainer's module
    (``whole_module``: dp), or a reshard moves every parameter under its HF name from an ``hf``-style
    trainer (e.g. fsdp's all-gathered parameters) into the ``hf`` generator whole (tp = 1) or into
    vLLM's staging layout, which its engine rank reassembles (``flowrl.parallel.named_spec``);
    megatron's fused layout has no names for the vision tower."""
    train, gen = TRAIN_BACKENDS.spec(cfg.actor.strategy), GEN_BACKENDS.spec(cfg.rollout.name)
    if train.whole_module:
        return
    if train.shard_style is not ShardStyle.HF or gen.shard_style not in (ShardStyle.HF, ShardStyle.VLLM):
        raise ConfigError("actor.strategy", cfg.actor.strategy, f"{what}; the weight sync from this strategy "
                          f"({train.shard_style} layout) to {cfg.rollout.name} ({gen.shard_style} layout) has no names "
                          "for the vision tower", "use an hf-layout trainer (dp, fsdp)")
    tp = getattr(cfg.rollout, "tensor_model_parallel_size", 1)
    if tp != 1 and gen.shard_style is ShardStyle.HF:
        raise ConfigError("rollout.tensor_model_parallel_size", tp, f"{what}; the {cfg.rollout.name} generator holds "
                          "its weights whole (every parameter by its name), not split over tensor-parallel ranks",
                          "set rollout.tensor_model_parallel_size=1")

"""Pre-flight checks for a vision-language ``model.path`` (Qwen2-VL / Qwen2.5-VL): what flowrl runs
one with, refused on the driver before any worker starts (``flowrl.run.preflight``).

A VLM trains in a strategy whose spec says ``vision_language`` (``dp``, ``fsdp``), with a
generation backend that ``takes_images`` (``hf``; :mod:`flowrl.backends.vlm`), in any placement.
The generator decodes with the trainer's own module (``whole_module``: ``dp`` in the hybrid
placement) or gets the weights by a reshard of whole parameters under their HF names, vision tower
included (an ``hf``-layout trainer, ``dp`` or ``fsdp``, into the ``hf`` generator at tp = 1:
``flowrl.parallel.named_spec``; measured on the embedded task in the hybrid, split and colocated
placements). Refused: megatron (it does not build the vision tower); the vLLM backend
(:data:`NOT_TAKEN`: it generates and scores prompts with images, :mod:`flowrl.backends.generate.vllm_images`,
but the weight sync has no layout that carries a VLM into it, and vLLM 0.32's CPU build cannot load a
Qwen2-VL at all); multi-turn rollouts and Ulysses sequence parallelism (they do not carry the images); a critic or
reward model on it would read the ``<|image_pad|>`` tokens without the picture.
"""

from __future__ import annotations

from typing import Any

from flowrl.catalog.backends import GEN_BACKENDS, TRAIN_BACKENDS, ShardStyle, either
from flowrl.config.errors import ConfigError

NOT_TAKEN = {
    "vllm": "the vllm backend generates with the images (flowrl.backends.generate.vllm_images, GPU builds; "
            "vLLM 0.32's CPU build cannot load a Qwen2-VL: its qwen2_vl.py imports transformers' torchvision "
            "image processor) but no weight sync carries a VLM into it: the reshard's layouts of a VLM hold "
            "its parameters whole in the hf style only (flowrl.parallel.named_spec), not vLLM's staged one",
}
"""Why a generation backend whose spec does not ``takes_images`` refuses a VLM, where more is known
than that it is not given the images."""


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
        why = NOT_TAKEN.get(cfg.rollout.name, "this generation backend is not given the images")
        raise ConfigError("rollout.name", cfg.rollout.name, f"{what}; {why}",
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
    (``whole_module``: dp), or a reshard moves every parameter whole under its HF name (an ``hf``-style
    trainer, e.g. fsdp's all-gathered parameters, into the ``hf`` generator: ``flowrl.parallel.named_spec``);
    the fused or split layouts (megatron's, vLLM's, tp > 1) have no names for the vision tower."""
    train, gen = TRAIN_BACKENDS.spec(cfg.actor.strategy), GEN_BACKENDS.spec(cfg.rollout.name)
    if train.whole_module:
        return
    if train.shard_style is not ShardStyle.HF or gen.shard_style is not ShardStyle.HF:
        raise ConfigError("actor.strategy", cfg.actor.strategy, f"{what}; the weight sync from this strategy "
                          f"({train.shard_style} layout) to {cfg.rollout.name} ({gen.shard_style} layout) has no names "
                          "for the vision tower", "use an hf-layout trainer (dp, fsdp) with an hf-layout generator")
    tp = getattr(cfg.rollout, "tensor_model_parallel_size", 1)
    if tp != 1:
        raise ConfigError("rollout.tensor_model_parallel_size", tp, f"{what}; its weights are synced whole "
                          "(every parameter by its name), not split over tensor-parallel ranks",
                          "set rollout.tensor_model_parallel_size=1")

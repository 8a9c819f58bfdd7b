"""A vision-language model's value model (the PPO critic on a Qwen2-VL / Qwen2.5-VL policy): the
VLM's backbone, vision tower included, with a one-output ``score`` head on its language model's
last hidden state, as verl builds a VLM critic (the causal VLM with a value head).

transformers has no ``AutoModelForTokenClassification`` for these configs; :func:`register`
adds one per architecture (``Qwen2VLForTokenClassification``, ``Qwen2_5_VLForTokenClassification``),
so the ``dp`` / ``fsdp`` value engines load a VLM exactly as they load a text critic: the
checkpoint's backbone (the causal VLM's own weight renames applied: ``visual.*`` to
``model.visual.*``, ``model.*`` to ``model.language_model.*``) and a new ``score`` head
(:mod:`flowrl.models.value_head`). Its parameters are the causal VLM's under the same names, less
``lm_head``, plus ``score.*``.

``forward`` is the text path (ids, no images); a batch with images goes through the policy's own
forward, :func:`flowrl.backends.vlm.vlm_hidden` (pixels through the tower into the
``<|image_pad|>`` slots, multimodal rotary positions in every layout), then the head
(``flowrl.backends.train.dp_value``).

Shape letters: B rows, L length, H hidden.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]

ARCHITECTURES = (
    # (config, causal VLM whose checkpoint renames the classifier shares, its backbone, pretrained base)
    ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", "Qwen2VLModel", "Qwen2VLPreTrainedModel",
     "transformers.models.qwen2_vl.modeling_qwen2_vl"),
    ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLModel", "Qwen2_5_VLPreTrainedModel",
     "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl"),
)

_CLASSES: dict[str, type] = {}


def _classifier(pretrained: type, backbone: type, name: str) -> type:
    """A token-classification class (``num_labels`` outputs per position) on ``backbone``."""
    from torch import nn
    from transformers.modeling_outputs import TokenClassifierOutput

    class VLMForTokenClassification(pretrained):  # type: ignore[misc, valid-type]
        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.num_labels = config.num_labels
            self.model = backbone(config)
            self.score = nn.Linear(config.get_text_config().hidden_size, config.num_labels)
            self.post_init()

        def get_input_embeddings(self) -> nn.Module:
            return self.model.get_input_embeddings()

        def set_input_embeddings(self, value: nn.Module) -> None:
            self.model.set_input_embeddings(value)

        def forward(self, input_ids: Any = None, attention_mask: Any = None, position_ids: Any = None,
                    inputs_embeds: Any = None, **kwargs: Any) -> TokenClassifierOutput:
            """``logits_BL1``: the head on the language model's last hidden state (text only:
            images go through ``flowrl.backends.vlm.vlm_hidden``)."""
            hidden_BLH = self.model.language_model(input_ids=input_ids, attention_mask=attention_mask,
                                                   position_ids=position_ids, inputs_embeds=inputs_embeds,
                                                   use_cache=False).last_hidden_state
            return TokenClassifierOutput(logits=self.score(hidden_BLH))

    VLMForTokenClassification.__name__ = VLMForTokenClassification.__qualname__ = name
    return VLMForTokenClassification


def register() -> None:
    """``AutoModelForTokenClassification`` builds each VLM architecture's value model, loading its
    causal checkpoint's weights under their in-memory names (idempotent)."""
    import importlib

    import transformers
    from transformers import AutoModelForTokenClassification
    from transformers import conversion_mapping as renames

    for config_name, causal_name, backbone_name, base_name, module_name in ARCHITECTURES:
        name = causal_name.replace("ForConditionalGeneration", "ForTokenClassification")
        if name not in _CLASSES:
            module = importlib.import_module(module_name)
            _CLASSES[name] = _classifier(getattr(module, base_name), getattr(module, backbone_name), name)
            causal = renames.get_checkpoint_conversion_mapping(causal_name)
            if causal and renames.get_checkpoint_conversion_mapping(name) is None:
                renames.register_checkpoint_conversion_mapping(name, causal)
        AutoModelForTokenClassification.register(getattr(transformers, config_name), _CLASSES[name], exist_ok=True)

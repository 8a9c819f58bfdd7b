"""The ``dp`` backend for a value model (the PPO critic): a token-classification head on the policy's
model family, data parallel over torch.distributed like ``TorchDPEngine``.

The model is ``AutoModelForTokenClassification(num_labels=1)`` loaded from a causal-LM directory
(as verl and TRL build their critics): the backbone's weights come from the checkpoint, the
one-output ``score`` head is new. A vision-language model's (Qwen2-VL / Qwen2.5-VL:
:mod:`flowrl.models.vlm_value`) is its whole backbone, vision tower included, and a batch with
images runs the policy's VLM forward (``TorchDPEngine._hidden``: the pixels in the
``<|image_pad|>`` slots, multimodal rotary positions in every layout) before the head. The value of response token ``t`` is read at the position that
predicts it (``pos - 1``, or ``Padded.pred_T`` with shared prompts: the state before the token is
emitted), as verl slices its values.
Gradients reduce once per optimizer step, with losses normalised by global counts, as in
``dp_policy``.

Shape letters: B rows, L padded length, T response tokens.
"""

from __future__ import annotations

import torch

from flowrl.backends.interfaces import ValueLossFn, model_kwargs
from flowrl.backends.train.dp_policy import TorchDPEngine
from flowrl.data.packed import PackedBatch
from flowrl.models import vlm
from flowrl.models.value_head import HEAD

class TorchDPValueEngine(TorchDPEngine):
    def _load_model(self, model_dir: str, dtype: torch.dtype) -> torch.nn.Module:
        """The checkpoint's backbone with a one-output token-classification head (the value); a
        new head is ``value_head.new_head`` of the engine's seed (``torch.initial_seed()``, which
        the engines set before loading), as every backend and rank draws it."""
        from transformers import AutoModelForTokenClassification

        from flowrl.backends.train.value_head import load_classifier

        vlm.register_auto_classes()  # a VLM's value model (flowrl.models.vlm_value)
        return vlm.with_text_ids(load_classifier(AutoModelForTokenClassification, model_dir,
                                                 self._classifier_config(model_dir), dtype=dtype,
                                                 seed=torch.initial_seed()))

    @staticmethod
    def _classifier_config(model_dir: str):  # noqa: ANN205 - a transformers config
        """The classifier's config: one label, no dropout (values must be deterministic)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir, num_labels=1)
        config.classifier_dropout = 0.0
        return config

    _classifier_class = "AutoModelForTokenClassification"
    """The transformers auto class of the model (``_meta_model`` builds it on the meta device)."""

    def _values(self, mb: PackedBatch) -> torch.Tensor:
        padded, dev = mb.model_inputs(self.pad_id, self.pair_cost), self.device
        if self.ulysses is not None:  # this rank's slice of every line (flowrl.backends.train.ulysses)
            padded = self.ulysses.local(padded)
        self.slots_computed += padded.num_slots
        if mb.images is not None:  # the policy's VLM forward, then the head where a token is predicted
            hidden_BLH = self._hidden(mb, padded)
            values_T = getattr(self.model, HEAD)(hidden_BLH[padded.row_T.to(dev), padded.pred_T.to(dev)])[:, 0].float()
        else:
            scores_BL1 = self.model(**model_kwargs(padded, dev, self.model.config._attn_implementation)).logits
            values_T = scores_BL1[padded.row_T.to(dev), padded.pred_T.to(dev), 0].float()
        return (values_T if self.ulysses is None else self.ulysses.gather(values_T)[0]).cpu()

    @torch.no_grad()
    def forward_values(self, batch: PackedBatch, *, micro_batch_size: int) -> torch.Tensor:
        """The value of every response token, flat ``_T`` (float32)."""
        was_training = self.model.training
        self.model.eval()
        try:
            outs = [self._values(mb) for mb in self._micro_batches(batch, micro_batch_size)]
        finally:
            self.model.train(was_training)
        values_T = torch.cat(outs) if outs else torch.empty(0)
        return values_T if self.ulysses is None else self.ulysses.own(values_T)

    def train_step_values(self, batch: PackedBatch, *, micro_batch_size: int, loss_fn: ValueLossFn) -> dict[str, float]:
        """One optimizer step over ``batch`` (this rank's share), accumulating micro-batches;
        ``loss_fn(values_T, mb)`` returns a loss normalised by the global denominator. Stats are
        token-weighted means over all ranks, plus ``grad_norm`` and ``lr``."""
        return self._accumulate_and_step(batch, micro_batch_size, lambda mb: loss_fn(self._values(mb), mb))

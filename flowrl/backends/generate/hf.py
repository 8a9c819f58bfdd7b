"""The ``hf`` generation backend: a KV-cache decode loop over a transformers model, batched, on the
rank's device (the CPU by default; a GPU rank's ``cuda:0``, the model loaded in bf16 unless
``model.dtype`` says otherwise); rows that reach EOS leave the batch (``hf_decode``), samples as
``generate``'s. Tokens and log-probs come back to the host as lists.

Returns, per sampled sequence, the response tokens up to and including EOS and the log-prob of
each sampled token under ``logits / temperature`` (the quantity the trainer recomputes, as in
verl), not under the top-k/top-p-warped distribution.

Shape letters: B prompts, N = B * n sequences, P padded prompt length, L new tokens, V vocabulary.
"""

from __future__ import annotations

import torch

from flowrl.backends.interfaces import SamplingParams, torch_dtype


class HFGenerator:
    last_stats = None
    """The last ``generate``'s ``DecodeStats`` (positions computed, real tokens fed)."""
    last_routed_experts = None
    """Mixture-of-experts models: the last ``generate``'s experts per sequence (flat int16 arrays
    of ``(P + R) * layers * top_k``, the ``routed_experts`` column, ``flowrl.models.moe_routing``);
    None for a dense model."""

    def __init__(self, model_dir: str, *, dtype: str = "float32", device: str = "cpu",
                 model: torch.nn.Module | None = None) -> None:
        """``device``: the rank's; ``dtype``: ``model.dtype`` (``auto``: bf16 on a GPU, fp32 on the
        CPU). With ``model`` (the hybrid engine's shared module) the module stays where and as
        the trainer holds it, and generation runs under the trainer's autocast."""
        from transformers import AutoModelForCausalLM

        from flowrl.backends.train.precision import placement
        from flowrl.models.vlm import register_auto_classes, with_text_ids

        register_auto_classes()  # Qwen2-VL / Qwen2.5-VL load as causal LMs
        if model is not None:  # the hybrid engine: the trainer's live module, not loaded, not frozen
            self.model = model
            where = next(model.parameters()).device  # the trainer's placement wins
            self.device, self.precision = placement(str(where), dtype, trainable=True)
        else:
            self.device, self.precision = placement(device, dtype, trainable=False)
            self.model = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=torch_dtype(self.precision.param_dtype)).to(self.device)
            self.model.eval()
            self.model.requires_grad_(False)
        with_text_ids(self.model)  # a VLM: pad/eos ids from its text config
        cfg = self.model.generation_config
        eos = cfg.eos_token_id if cfg.eos_token_id is not None else self.model.config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
        pad = self.model.config.pad_token_id
        self.pad_id = pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, *, seed: int = 0, micro_batch_size: int = 256,
        images: list | None = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample ``params.n`` responses per prompt; results are prompt-major (prompt 0's n
        samples first). Finished rows leave the decode batch (``hf_decode``); what the model
        computed is in :attr:`last_stats`."""
        from flowrl.backends.generate.hf_decode import DecodeStats, decode
        from flowrl.backends.train.precision import autocast

        from flowrl.models.moe_routing import is_moe

        torch.manual_seed(seed)
        responses: list[list[int]] = []
        logprobs: list[list[float]] = []
        routes: list[torch.Tensor] | None = [] if is_moe(self.model) else None
        self.last_routed_experts = None
        self.last_stats = DecodeStats()
        if images is not None and any(images):  # each prompt's encoded images (a VLM): flowrl.backends.vlm
            from flowrl.backends.vlm import generate_with_images

            return generate_with_images(self, prompts, images, params, micro_batch_size)
        prompts_per_call = max(1, micro_batch_size // params.n)
        for start in range(0, len(prompts), prompts_per_call):
            with autocast(self.device, self.precision):
                r, lp, stats = decode(self.model, prompts[start : start + prompts_per_call], params,
                                      eos_ids=self.eos_ids, pad_id=self.pad_id, device=self.device, routes=routes)
            responses += r
            logprobs += lp
            self.last_stats.add(stats)
        self.last_routed_experts = None if routes is None else [x.reshape(-1).numpy() for x in routes]
        return responses, logprobs

    @torch.no_grad()
    def logprobs(self, prompts: list[list[int]], responses: list[list[int]], *,
                 temperature: float = 1.0) -> list[list[float]]:
        """Teacher-forced log-probs of each response token under ``logits / temperature`` (one
        right-padded forward pass): what the trainer computes, for parity checks."""
        rows = [p + r for p, r in zip(prompts, responses)]
        longest = max(len(x) for x in rows)
        ids_BL = torch.full((len(rows), longest), self.pad_id, dtype=torch.long)
        mask_BL = torch.zeros((len(rows), longest), dtype=torch.long)
        for i, x in enumerate(rows):
            ids_BL[i, : len(x)] = torch.tensor(x, dtype=torch.long)
            mask_BL[i, : len(x)] = 1
        from flowrl.backends.train.precision import autocast

        with autocast(self.device, self.precision):
            logits_BLV = self.model(input_ids=ids_BL.to(self.device), attention_mask=mask_BL.to(self.device)).logits
        logits_BLV = logits_BLV.float().cpu()
        if temperature != 1.0:
            logits_BLV = logits_BLV / temperature
        logp_BLV = torch.log_softmax(logits_BLV, dim=-1)
        out = []
        for i, (p, r) in enumerate(zip(prompts, responses)):
            pos = torch.arange(len(p) - 1, len(p) + len(r) - 1)  # position t predicts token t + 1
            out.append(logp_BLV[i, pos, torch.tensor(r, dtype=torch.long)].tolist())
        return out

    def reshard_target(self) -> dict[str, torch.Tensor]:
        """The live parameters by HF name (tied weights once), overwritten in place by a reshard
        (``hf`` style, tp = 1)."""
        return {n: p.detach() for n, p in self.model.named_parameters()}

    def load_hf_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take the trainer's weights (full HF-named state)."""
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("lm_head.weight") or not self.model.config.tie_word_embeddings]
        if missing or unexpected:
            raise ValueError(f"weight sync: missing {missing[:5]}, unexpected {unexpected[:5]}")

    def sleep(self) -> None:
        """Nothing to release (no KV cache kept between calls)."""

    def wake_up(self) -> None:
        """Nothing to restore."""

    def close(self) -> None:
        """Nothing to stop (the model goes with the process)."""

"""The ``hf`` generation backend: transformers ``generate`` with the KV cache, batched (CPU default).

Returns, per sampled sequence, the response tokens up to and including EOS and the log-prob of
each sampled token under ``logits / temperature`` (the quantity the trainer recomputes, as in
verl), not under the top-k/top-p-warped distribution.

Shape letters: B prompts, N = B * n sequences, P padded prompt length, L new tokens, V vocabulary.
"""

from __future__ import annotations

import torch

from flowrl.backends.interfaces import SamplingParams, torch_dtype


class HFGenerator:
    def __init__(self, model_dir: str, *, dtype: str = "float32") -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype(dtype))
        self.model.eval()
        self.model.requires_grad_(False)
        cfg = self.model.generation_config
        eos = cfg.eos_token_id if cfg.eos_token_id is not None else self.model.config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
        pad = self.model.config.pad_token_id
        self.pad_id = pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, *, seed: int = 0, micro_batch_size: int = 256
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample ``params.n`` responses per prompt; results are prompt-major (prompt 0's n
        samples first)."""
        torch.manual_seed(seed)
        responses: list[list[int]] = []
        logprobs: list[list[float]] = []
        prompts_per_call = max(1, micro_batch_size // params.n)
        for start in range(0, len(prompts), prompts_per_call):
            chunk = prompts[start : start + prompts_per_call]
            r, lp = self._generate_chunk(chunk, params)
            responses += r
            logprobs += lp
        return responses, logprobs

    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams) -> tuple[list[list[int]], list[list[float]]]:
        # Left-pad the prompts so generation continues every row at the same position.
        longest = max(len(p) for p in prompts)
        input_ids_BP = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        attention_BP = torch.zeros((len(prompts), longest), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids_BP[i, longest - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention_BP[i, longest - len(p) :] = 1
        sampling = {}
        if not params.greedy:
            sampling = {
                "do_sample": True,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k if params.top_k > 0 else None,
            }
        else:
            sampling = {"do_sample": False}
        out = self.model.generate(
            input_ids=input_ids_BP,
            attention_mask=attention_BP,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.n,
            eos_token_id=sorted(self.eos_ids) or None,
            pad_token_id=self.pad_id,
            use_cache=True,
            return_dict_in_generate=True,
            output_logits=True,
            **sampling,
        )
        new_NL = out.sequences[:, longest:]
        logits_NLV = torch.stack(out.logits, dim=1).float()
        if not params.greedy and params.temperature != 1.0:
            logits_NLV = logits_NLV / params.temperature
        logp_NL = torch.log_softmax(logits_NLV, dim=-1).gather(-1, new_NL.unsqueeze(-1)).squeeze(-1)
        lengths_N = self._lengths(new_NL)
        responses = [row[:n].tolist() for row, n in zip(new_NL, lengths_N)]
        logprobs = [row[:n].tolist() for row, n in zip(logp_NL, lengths_N)]
        return responses, logprobs

    def _lengths(self, new_NL: torch.Tensor) -> list[int]:
        """Tokens up to and including the first EOS (all of them when none)."""
        num_new = new_NL.shape[1]
        if not self.eos_ids:
            return [num_new] * new_NL.shape[0]
        is_eos = torch.zeros_like(new_NL, dtype=torch.bool)
        for e in self.eos_ids:
            is_eos |= new_NL == e
        first = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, torch.full_like(new_NL[:, 0], num_new))
        return first.tolist()

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
        logits_BLV = self.model(input_ids=ids_BL, attention_mask=mask_BL).logits.float()
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

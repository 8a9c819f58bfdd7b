"""The built-in tasks' warm-up: an ``sft`` run (:class:`flowrl.graphs.sft.InProcessSFT`) that
stops once a probe of the model says it is ready, and the accuracy checks the tasks use.

The warm-up is ``flowrl train algorithm.family=sft`` on one rank in this process: the same config
keys (``algorithm.sft.label_smoothing``, ``actor.optim.*``), the same data path, role, engine and
loss; only the Dask graph around the step is left out (a tiny model trains faster than a cluster
starts). Label smoothing keeps the policy uncertain when sampled: often right greedily, rarely
right at temperature 1.0, the state in which RL visibly helps.

Shapes: B = batch (sequences), T = tokens per sequence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclasses.dataclass(kw_only=True, frozen=True)
class WarmupConfig:
    """How the warm-up trains (as ``flowrl train algorithm.family=sft`` keys) and when it stops."""

    max_steps: int = 1500
    """Upper bound on optimizer steps (``trainer.total_training_steps``); usually stops earlier."""
    batch_size: int = 128
    """Sequences per step (``data.train_batch_size``, one optimizer step each)."""
    lr: float = 3e-3
    """AdamW peak learning rate (``actor.optim.lr``; betas 0.9/0.98, no weight decay or clipping)."""
    lr_warmup_steps: int = 50
    """Steps of linear learning-rate warm-up (``actor.optim.lr_warmup_steps``)."""
    label_smoothing: float = 0.4
    """``algorithm.sft.label_smoothing``: keeps the sampled policy uncertain (low sampled accuracy)."""
    target_greedy_accuracy: float | None = 0.8
    """Stop once the probe (the task's: greedy accuracy by default) reaches this; None: all max_steps."""
    check_every: int = 25
    """Steps between two probe evaluations."""
    num_probe_rows: int = 128
    """Rows (the first ones) on which the stopping accuracy is measured."""
    num_threads: int | None = 1
    """torch threads during the warm-up (results then do not depend on the machine's core count);
    None leaves torch's setting."""

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "check_every", "num_probe_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"WarmupConfig.{name}={getattr(self, name)} must be at least 1")
        if self.lr_warmup_steps < 0:
            raise ValueError(f"WarmupConfig.lr_warmup_steps={self.lr_warmup_steps} must be >= 0")
        if not self.lr > 0:
            raise ValueError(f"WarmupConfig.lr={self.lr} must be positive")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"WarmupConfig.label_smoothing={self.label_smoothing} must be in [0, 1)")
        target = self.target_greedy_accuracy
        if target is not None and not 0.0 < target <= 1.0:
            raise ValueError(f"WarmupConfig.target_greedy_accuracy={target} must be in (0, 1], or None to train "
                             "all max_steps")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"WarmupConfig.num_threads={self.num_threads} must be >= 1 or None")

    def overrides(self, *, model_dir: str | Path, train_files: str, seed: int) -> list[str]:
        """The ``flowrl train algorithm.family=sft`` keys of this warm-up."""
        return ["algorithm.family=sft", "actor.data_parallel_size=1", f"model.path={model_dir}",
                f"data.train_files={train_files}",
                f"data.train_batch_size={self.batch_size}", f"actor.ppo_mini_batch_size={self.batch_size}",
                f"actor.ppo_micro_batch_size_per_gpu={self.batch_size}", f"actor.optim.lr={self.lr}",
                f"actor.optim.lr_warmup_steps={self.lr_warmup_steps or -1}", "actor.optim.betas=[0.9,0.98]",
                "actor.optim.weight_decay=0.0", "actor.optim.grad_clip=0.0",
                f"algorithm.sft.label_smoothing={self.label_smoothing}",
                f"trainer.total_training_steps={self.max_steps}", f"trainer.seed={seed}", "model.dtype=float32"]


@dataclasses.dataclass(kw_only=True, frozen=True)
class WarmupResult:
    """What a warm-up did."""

    num_steps: int
    """Optimizer steps taken."""
    seconds: float
    """Wall-clock time of the warm-up, probe evaluations included."""
    final_loss: float
    """The last step's mean NLL per answer token (``actor/sft_loss``, without the smoothing)."""
    probe_accuracy: float | None
    """The probe's value at the last check (None if never checked)."""


def sft_warm_up(model_dir: str | Path, train_files: str, config: WarmupConfig, *, seed: int, out_dir: str | Path,
                probe: Callable[[PreTrainedModel], float], target: float | None = None,
                dataset: Any = None) -> WarmupResult:
    """Train the model of ``model_dir`` with the ``sft`` family on ``train_files`` (or on
    ``dataset``, rows already tokenized: :func:`token_rows`), calling ``probe(model)`` every
    ``check_every`` steps and stopping once it reaches ``target`` (default:
    ``config.target_greedy_accuracy``; None: all ``max_steps``, probing all the same); save the
    trained weights to ``out_dir`` (a transformers directory, without the tokenizer)."""
    from flowrl.config import load_config
    from flowrl.graphs.sft import InProcessSFT

    target = config.target_greedy_accuracy if target is None else target
    cfg = load_config(None, config.overrides(model_dir=model_dir, train_files=train_files, seed=seed))
    start, accuracy, stats, step = time.perf_counter(), None, {}, 0
    with torch_threads(config.num_threads):
        sft = InProcessSFT(cfg, dataset)
        for step in range(1, config.max_steps + 1):
            stats = sft.step(step - 1)
            if step % config.check_every == 0:
                accuracy = probe(sft.model)
                sft.model.train()
                if target is not None and accuracy >= target:
                    break
        sft.model.eval()
        sft.save(str(out_dir))
    return WarmupResult(num_steps=step, seconds=time.perf_counter() - start,
                        final_loss=float(stats.get("actor/sft_loss", float("nan"))), probe_accuracy=accuracy)


def token_rows(prompts: Sequence[list[int]], responses: Sequence[list[int]], masks: Sequence[list[int]]) -> Any:
    """Tokenized SFT rows (a :class:`~flowrl.data.chat.TokenRows`) from token lists: each row's
    prompt, its response and the response's loss mask (1: trained)."""
    from flowrl.data.chat import TokenRows, token_table

    return TokenRows(token_table(prompts, responses, masks), [])


def prompt_texts(tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict]) -> list[str]:
    """Each row's chat ``prompt`` rendered with the tokenizer's chat template."""
    return tokenizer.apply_chat_template([row["prompt"] for row in rows], add_generation_prompt=True, tokenize=False)


@contextlib.contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with ``num_threads`` torch threads (None: leave the setting alone)."""
    import torch

    if num_threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def evaluate_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    *,
    num_samples: int,
    temperature: float,
    max_new_tokens: int = 8,
    batch_size: int = 256,
    seed: int = 0,
) -> float:
    """Mean reward (``auto`` by each row's data_source) of ``model.generate`` answers.

    ``temperature == 0`` decodes greedily (one answer per row whatever ``num_samples``); otherwise
    ``num_samples`` answers per row are sampled at ``temperature`` with no top-k/top-p, from a
    generator seeded with ``seed`` (the global RNG is restored afterwards). Responses are decoded
    without special tokens, so without EOS.
    """
    import torch

    from flowrl.rewards import resolve_reward_fn

    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 decodes greedily)")
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be at least 1")
    if not rows:
        raise ValueError("evaluate_accuracy needs at least one row")
    greedy = temperature == 0
    num_samples = 1 if greedy else num_samples
    if greedy:
        sampling = dict(do_sample=False)
    else:
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    score = resolve_reward_fn("auto")
    was_training = model.training
    model.eval()
    total = 0.0
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for begin in range(0, len(rows), batch_size):
            total = _score_chunk(model, tokenizer, rows[begin : begin + batch_size], total, score=score,
                                 sampling=sampling, num_samples=num_samples, max_new_tokens=max_new_tokens)
    model.train(was_training)
    return total / (len(rows) * num_samples)


def _score_chunk(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, chunk: Sequence[dict],
                 total: float, *, score: Any, sampling: dict, num_samples: int, max_new_tokens: int) -> float:
    """``total`` plus the rewards of ``num_samples`` generated answers to every row of ``chunk``
    (added one by one, in order)."""
    encoded = tokenizer(
        prompt_texts(tokenizer, chunk),
        return_tensors="pt",
        padding=True,
        add_special_tokens=False,
    )
    output_BT = model.generate(
        **encoded,
        **sampling,
        num_return_sequences=num_samples,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    responses = tokenizer.batch_decode(
        output_BT[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True
    )
    for i, response in enumerate(responses):
        row = chunk[i // num_samples]
        result = score(
            row["data_source"], response, row["reward_model"]["ground_truth"],
            row.get("extra_info"),
        )
        total += result["score"] if isinstance(result, dict) else result
    return total


def sample_answers(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict], *,
                   num_samples: int, temperature: float = 1.0, max_new_tokens: int = 8, batch_size: int = 256,
                   seed: int = 0) -> list[list[str]]:
    """``num_samples`` answers of ``model`` to each row's chat ``prompt``, sampled at
    ``temperature`` (no top-k/top-p) from a generator seeded with ``seed`` (the global RNG is
    restored afterwards), decoded without special tokens."""
    import torch

    if not temperature > 0 or num_samples < 1:
        raise ValueError(f"temperature={temperature} must be > 0 and num_samples={num_samples} at least 1")
    was_training, out = model.training, []
    model.eval()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for begin in range(0, len(rows), batch_size):
            encoded = tokenizer(prompt_texts(tokenizer, rows[begin: begin + batch_size]), return_tensors="pt",
                                padding=True, add_special_tokens=False)
            output_BT = model.generate(**encoded, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                       num_return_sequences=num_samples, max_new_tokens=max_new_tokens,
                                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            texts = tokenizer.batch_decode(output_BT[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
            out.extend(texts[i: i + num_samples] for i in range(0, len(texts), num_samples))
    model.train(was_training)
    return out

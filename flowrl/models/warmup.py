"""Supervised warm-up of a tiny model on prompt/answer rows, and a quick accuracy check.

The warm-up is plain torch: AdamW on ``prompt + answer + <eos>`` sequences with the loss on the
answer and EOS tokens only. It trains with label smoothing and stops as soon as greedy decoding
solves ``target_greedy_accuracy`` of a probe set, which leaves a policy that is often right
greedily but rarely right when sampled at temperature 1.0: the state in which RL visibly helps.

Shapes: B = batch (sequences), T = tokens per sequence, V = vocabulary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclasses.dataclass(kw_only=True, frozen=True)
class WarmupConfig:
    """How the supervised warm-up trains and when it stops."""

    max_steps: int = 1500
    """Upper bound on optimizer steps; the warm-up usually stops earlier (see target)."""
    batch_size: int = 128
    """Sequences per step, drawn with replacement from the rows."""
    lr: float = 3e-3
    """AdamW peak learning rate (betas 0.9/0.98, no weight decay)."""
    lr_warmup_steps: int = 50
    """Steps of linear learning-rate warm-up from lr/lr_warmup_steps to lr."""
    label_smoothing: float = 0.4
    """Cross-entropy label smoothing: keeps the sampled policy uncertain (low sampled accuracy)."""
    target_greedy_accuracy: float | None = 0.8
    """Stop once greedy accuracy on the probe rows reaches this; None trains all max_steps."""
    check_every: int = 25
    """Steps between two probe evaluations."""
    num_probe_rows: int = 128
    """Rows (the first ones) on which the stopping accuracy is measured."""
    num_threads: int | None = 1
    """torch threads during the warm-up (results then do not depend on the machine's core count);
    None leaves torch's setting."""

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "check_every", "num_probe_rows"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"WarmupConfig.{name}={value} must be at least 1")
        if self.lr_warmup_steps < 0:
            raise ValueError(f"WarmupConfig.lr_warmup_steps={self.lr_warmup_steps} must be >= 0")
        if not self.lr > 0:
            raise ValueError(f"WarmupConfig.lr={self.lr} must be positive")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(
                f"WarmupConfig.label_smoothing={self.label_smoothing} must be in [0, 1)"
            )
        target = self.target_greedy_accuracy
        if target is not None and not 0.0 < target <= 1.0:
            raise ValueError(
                f"WarmupConfig.target_greedy_accuracy={target} must be in (0, 1], or None to "
                "train all max_steps"
            )
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"WarmupConfig.num_threads={self.num_threads} must be >= 1 or None")


@dataclasses.dataclass(kw_only=True, frozen=True)
class WarmupResult:
    """What a warm-up did."""

    num_steps: int
    """Optimizer steps taken."""
    seconds: float
    """Wall-clock time of the warm-up, probe evaluations included."""
    final_loss: float
    """Training loss (with label smoothing) of the last step."""
    probe_greedy_accuracy: float | None
    """Greedy accuracy on the probe rows at the last check (None if never checked)."""


def prompt_texts(tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict]) -> list[str]:
    """Each row's chat ``prompt`` rendered with the tokenizer's chat template."""
    return tokenizer.apply_chat_template(
        [row["prompt"] for row in rows], add_generation_prompt=True, tokenize=False
    )


def encode_supervised(
    tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids_BT, attention_mask_BT, labels_BT)`` for ``prompt + ground_truth + <eos>``.

    Right-padded; labels are -100 except on the answer and EOS tokens.
    """
    import torch

    prompt_ids = tokenizer(prompt_texts(tokenizer, rows), add_special_tokens=False)["input_ids"]
    answers = [str(row["reward_model"]["ground_truth"]) for row in rows]
    answer_ids = [
        ids + [tokenizer.eos_token_id]
        for ids in tokenizer(answers, add_special_tokens=False)["input_ids"]
    ]
    length = max(len(p) + len(a) for p, a in zip(prompt_ids, answer_ids))
    input_ids_BT = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask_BT = torch.zeros((len(rows), length), dtype=torch.long)
    labels_BT = torch.full((len(rows), length), -100, dtype=torch.long)
    for i, (prompt, answer) in enumerate(zip(prompt_ids, answer_ids)):
        end = len(prompt) + len(answer)
        input_ids_BT[i, :end] = torch.tensor(prompt + answer)
        attention_mask_BT[i, :end] = 1
        labels_BT[i, len(prompt) : end] = torch.tensor(answer)
    return input_ids_BT, attention_mask_BT, labels_BT


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


def _optimizer(model: PreTrainedModel, config: WarmupConfig) -> tuple[Any, Any]:
    """AdamW with a linear learning-rate ramp over ``config.lr_warmup_steps``."""
    import torch

    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=(0.9, 0.98), weight_decay=0.0
    )
    ramp = max(config.lr_warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / ramp)
    )
    return optimizer, scheduler


def _train_step(model: PreTrainedModel, optimizer: Any, scheduler: Any, input_ids_BT: Any,
                attention_mask_BT: Any, labels_BT: Any, config: WarmupConfig) -> Any:
    """One supervised step on a batch; returns the loss (0-d tensor)."""
    import torch.nn.functional as F

    logits_BTV = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT).logits
    # Position t predicts token t + 1.
    loss = F.cross_entropy(
        logits_BTV[:, :-1].flatten(0, 1),
        labels_BT[:, 1:].flatten(),
        ignore_index=-100,
        label_smoothing=config.label_smoothing,
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss


def warm_up(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    config: WarmupConfig,
    *,
    seed: int = 0,
) -> WarmupResult:
    """Train ``model`` in place on ``rows`` (verl-format rows with a ground truth).

    Deterministic for a seed: batches come from a private generator, the global RNG is untouched.
    """
    import torch

    input_ids_BT, attention_mask_BT, labels_BT = encode_supervised(tokenizer, rows)
    probe_rows = list(rows[: config.num_probe_rows])
    optimizer, scheduler = _optimizer(model, config)
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    loss = torch.tensor(float("nan"))
    probe_accuracy = None
    step = 0
    with torch_threads(config.num_threads):
        model.train()
        for step in range(1, config.max_steps + 1):
            index_B = torch.randint(0, len(rows), (config.batch_size,), generator=generator)
            loss = _train_step(model, optimizer, scheduler, input_ids_BT[index_B], attention_mask_BT[index_B],
                               labels_BT[index_B], config)
            if config.target_greedy_accuracy is not None and step % config.check_every == 0:
                probe_accuracy = evaluate_accuracy(
                    model, tokenizer, probe_rows, num_samples=1, temperature=0.0
                )
                model.train()
                if probe_accuracy >= config.target_greedy_accuracy:
                    break
        model.eval()
    return WarmupResult(
        num_steps=step,
        seconds=time.perf_counter() - start,
        final_loss=loss.item(),
        probe_greedy_accuracy=probe_accuracy,
    )


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

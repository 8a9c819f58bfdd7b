"""The learning-rate schedule of a trained policy or critic: verl's ``optim`` keys.

verl steps its actor's scheduler once per ``update_actor`` call, i.e. once per RL step, whatever
the number of mini-batches; so does flowrl: the role sets the rate before each update from the
number of updates done (restored from the checkpoint on resume). The rate of update ``step``
(0-based) out of ``total`` is ``lr * lr_factor(step, ...)``:

- warm-up (``num_warmup`` updates, verl's ``lr_warmup_steps`` or ``lr_warmup_steps_ratio * total``):
  ``step / num_warmup`` (so the first update runs at 0, as verl's and transformers' warm-ups do);
- then ``constant``: 1; ``cosine`` (verl's ``get_cosine_schedule_with_warmup``):
  ``min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + cos(2 pi num_cycles progress))``; ``linear``
  (transformers' ``get_linear_schedule_with_warmup``, TRL's default; ``min_lr_ratio`` as a floor):
  ``min_lr_ratio + (1 - min_lr_ratio) * max(0, (total - step) / (total - num_warmup))``, with
  ``progress = (step - num_warmup) / (total - num_warmup)``.

Pure Python (no torch): :func:`set_lr` writes the rate into any optimizer's ``param_groups``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SCHEDULES = ("constant", "cosine", "linear")


def num_warmup_steps(total: int, warmup_steps: int, warmup_ratio: float) -> int:
    """verl's rule: ``lr_warmup_steps`` when > 0, else ``int(lr_warmup_steps_ratio * total)``."""
    return warmup_steps if warmup_steps > 0 else int(warmup_ratio * total)


def lr_factor(step: int, *, total: int, schedule: str, num_warmup: int = 0, min_lr_ratio: float = 0.0,
              num_cycles: float = 0.5) -> float:
    """The multiplier of the peak rate for update ``step`` (0-based) of ``total``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")
    if step < num_warmup:
        return step / max(1, num_warmup)
    if schedule == "constant":
        return 1.0
    span = max(1, total - num_warmup)
    if schedule == "linear":
        decay = max(0.0, (total - step) / span)
    else:
        progress = min(1.0, (step - num_warmup) / span)
        decay = max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay


@dataclass(frozen=True, kw_only=True)
class LRSchedule:
    """A peak rate and its schedule over ``total`` updates (see the module docstring)."""

    lr: float
    total: int
    schedule: str = "constant"
    num_warmup: int = 0
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5

    @classmethod
    def from_optim(cls, optim: Any, total: int) -> "LRSchedule":
        """From an ``OptimConfig`` and the run's number of updates."""
        return cls(lr=optim.lr, total=total, schedule=optim.lr_scheduler_type,
                   num_warmup=num_warmup_steps(total, optim.lr_warmup_steps, optim.lr_warmup_steps_ratio),
                   min_lr_ratio=optim.min_lr_ratio, num_cycles=optim.num_cycles)

    def __call__(self, step: int) -> float:
        return self.lr * lr_factor(step, total=self.total, schedule=self.schedule, num_warmup=self.num_warmup,
                                   min_lr_ratio=self.min_lr_ratio, num_cycles=self.num_cycles)

    @property
    def is_constant(self) -> bool:
        return self.schedule == "constant" and self.num_warmup == 0


def set_lr(optimizer: Any, lr: float) -> None:
    """Write ``lr`` into every parameter group of ``optimizer`` (torch's or megatron-core's)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


class ScheduledRate:
    """A role's schedule and its count of updates: :meth:`before_update` sets the rate of the
    next update (a constant schedule leaves the optimizer untouched, bitwise the unscheduled
    run); :meth:`resume` continues from a checkpoint's step (one update per RL step, as verl)."""

    def __init__(self, optim: Any, total_steps: int) -> None:
        self.schedule = LRSchedule.from_optim(optim, total_steps)
        self.num_updates = 0

    def before_update(self, optimizer: Any) -> None:
        if optimizer is not None and not self.schedule.is_constant:
            set_lr(optimizer, self.schedule(self.num_updates))
        self.num_updates += 1

    def resume(self, checkpoint_path: str) -> None:
        from flowrl.checkpoint import load_meta

        self.num_updates = int(load_meta(checkpoint_path)["step"])


@dataclass(frozen=True, kw_only=True)
class AdamWSettings:
    """The optimizer keywords every train and value engine takes (``cls(model_dir, *, lr,
    weight_decay, betas, eps, grad_clip, ...)``), listed once: engines build it from their
    ``**optim`` keywords (an unknown one raises TypeError), roles from a config's ``optim``."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Global gradient-norm clip (0: none)."""

    @classmethod
    def from_config(cls, optim: Any) -> "AdamWSettings":
        """From an ``OptimConfig`` (``actor.optim``, ``critic.optim``)."""
        return cls(lr=optim.lr, weight_decay=optim.weight_decay, betas=optim.betas, eps=optim.eps,
                   grad_clip=optim.grad_clip)

    def engine_kwargs(self) -> dict[str, Any]:
        """The engine keywords: all five."""
        return {"lr": self.lr, "weight_decay": self.weight_decay, "betas": self.betas, "eps": self.eps,
                "grad_clip": self.grad_clip}

    def adamw_kwargs(self) -> dict[str, Any]:
        """``torch.optim.AdamW``'s four (the clip is the engine's)."""
        return {"lr": self.lr, "weight_decay": self.weight_decay, "betas": self.betas, "eps": self.eps}

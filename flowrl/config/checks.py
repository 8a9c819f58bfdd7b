"""``trainer.checks``: the run's checks of itself (issue 32, :mod:`flowrl.checks`).

One key per check, ``off`` | ``warn`` | ``error``: ``warn`` logs a failure (and shows it on the
``health:`` line) and goes on, ``error`` stops the run after logging the step, naming what
diverged and the likely cause. A name that is not a check is refused with the valid keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flowrl.config.errors import ConfigError, check

Mode = Literal["off", "warn", "error"] | bool
"""A check's mode. YAML reads a bare ``off`` as false (``trainer.checks.tokens=off``): false is
``off``; true (``on``) is refused for naming no mode."""


@dataclass(kw_only=True)
class ChecksConfig:
    staleness: Mode = "error"
    """Every trained row's weight-version lag (step minus ``weight_version``) is at most
    ``trainer.staleness`` (in stream mode also what ``trainer.max_queue_size`` allows)."""
    finite: Mode = "error"
    """No NaN/inf in the rewards (``score``, ``token_rewards``), ``advantages``, ``returns``, ``values``."""
    reward_signal: Mode = "warn"
    """Some learning signal within ``reward_signal_steps`` steps: a run whose rewards are all
    equal (all 0, or constant), or whose advantages are all 0, that many steps in a row fails.
    ``warn`` by default: a hard task often scores 0 for its first steps and then learns (set
    ``error`` to stop such a run)."""
    reward_signal_steps: int = 10
    """``reward_signal``: consecutive steps without a learning signal that fail the check
    (counted across a resume: each checkpoint keeps the count)."""
    reward_time: Mode = "warn"
    """The reward function takes no longer than the generation it scores (``timing_s/reward``
    <= ``timing_s/gen``)."""
    tokens: Mode = "error"
    """The response tokens the update trains on are those the engine generated (a hash per row,
    ``response_hash``, made by the ``gen`` node and compared after the step)."""
    logprob_agreement: Mode = "warn"
    """The rollout's log-probs of its tokens agree with the trainer's (where the step computes
    ``old_logprobs``): mean per-token KL at most ``logprob_kl_max``."""
    policy_moved: Mode = "warn"
    """After updates the rollout's log-probs have left the reference model's about as far as the
    trainer's have (``actor/kl_loss``): an engine still sampling the base model fails."""
    chat_template: Mode = "warn"
    """Multi-turn rollouts, at start: the agent loop's turn-by-turn tokens of a two-turn tool
    conversation equal the chat template's rendering of it, tokenized (the first differing token
    shown)."""
    weight_sync: Mode = "error"
    """After every weight sync the trainer's ranks and the generation ranks fingerprint every
    parameter slice they hold (the generation side reads its engine's own weights; with LoRA the
    adapters it installed) and the sync compares them: a mismatch names the parameter and ranks."""
    engine_moved: Mode = "warn"
    """With ``weight_sync``: each generation engine scores a fixed probe batch right after a sync;
    when the trainer's weights changed since the last sync, the probe's log-probs must have changed
    too (an engine sampling an old copy or the base model keeps them)."""
    resume: Mode = "error"
    """A resume restores what its checkpoint recorded (parameters, optimizer step and state norms,
    data position, seeds, the async queue, the family's state): a mismatch refuses the resume,
    naming what differs."""
    logprob_kl_max: float = 0.1
    """``logprob_agreement``'s alarm: the mean per-token KL (k3) between the rollout's and the
    trainer's log-probs of the rollout's tokens, in nats."""

    def __post_init__(self) -> None:
        for name in self.modes():
            value = getattr(self, name)
            if value is True:
                raise ConfigError(name, "on", "is not a mode", "use warn (log a failure) or error (stop the run)")
            if value is False:
                setattr(self, name, "off")
        check(isinstance(self.reward_signal_steps, int) and self.reward_signal_steps >= 1, "reward_signal_steps",
              self.reward_signal_steps, "must be an integer >= 1", "use e.g. 10")
        check(self.logprob_kl_max > 0, "logprob_kl_max", self.logprob_kl_max, "must be > 0", "use e.g. 0.1")

    def modes(self) -> dict[str, str]:
        """Check name -> mode (the fields typed :data:`Mode`)."""
        return {name: getattr(self, name) for name, tp in self.__annotations__.items() if tp in ("Mode", Mode)}

"""verl's learning-rate schedule keys (``actor.optim.lr_scheduler_type`` ...): the pure rate function
against transformers' schedulers, which verl (cosine) and TRL (linear) use, and the config checks."""

from __future__ import annotations

import math

import pytest

from flowrl.backends.train.optim import LRSchedule, ScheduledRate, lr_factor, num_warmup_steps
from flowrl.config import ConfigError, load_config


def _torch_rates(make, total, lr=1.0):
    import torch

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = make(opt)
    rates = []
    for _ in range(total):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


@pytest.mark.parametrize("warmup", [0, 3])
def test_linear_matches_transformers_linear_schedule_trls_default(warmup):
    from transformers import get_linear_schedule_with_warmup

    ref = _torch_rates(lambda o: get_linear_schedule_with_warmup(o, warmup, 10), 10)
    ours = [lr_factor(s, total=10, schedule="linear", num_warmup=warmup) for s in range(10)]
    assert ours == pytest.approx(ref, abs=1e-12)
    # no warm-up: step 0 at the full rate, step 9 at 1/10 (transformers: (10 - 9) / 10)
    if warmup == 0:
        assert ours[0] == 1.0 and ours[9] == pytest.approx(0.1)


@pytest.mark.parametrize("warmup", [0, 2])
def test_cosine_matches_transformers_cosine_schedule_verls(warmup):
    from transformers import get_cosine_schedule_with_warmup

    ref = _torch_rates(lambda o: get_cosine_schedule_with_warmup(o, warmup, 12), 12)
    ours = [lr_factor(s, total=12, schedule="cosine", num_warmup=warmup) for s in range(12)]
    assert ours == pytest.approx(ref, abs=1e-12)


def test_min_lr_ratio_is_the_floor_and_constant_warms_up():
    # cosine at the end of the decay: 0.5 * (1 + cos(pi)) = 0 -> the floor 0.2
    assert lr_factor(10, total=10, schedule="cosine", min_lr_ratio=0.2) == pytest.approx(0.2)
    # cosine halfway: 0.2 + 0.8 * 0.5 = 0.6
    assert lr_factor(5, total=10, schedule="cosine", min_lr_ratio=0.2) == pytest.approx(0.6)
    assert lr_factor(10, total=10, schedule="linear", min_lr_ratio=0.2) == pytest.approx(0.2)
    assert [lr_factor(s, total=10, schedule="constant", num_warmup=4) for s in range(6)] == [0, .25, .5, .75, 1, 1]
    assert num_warmup_steps(100, -1, 0.05) == 5 and num_warmup_steps(100, 7, 0.05) == 7
    with pytest.raises(ValueError, match="use one of constant, cosine, linear"):
        lr_factor(0, total=10, schedule="step")


def test_scheduled_rate_sets_the_rate_once_per_update_and_leaves_constant_alone():
    class Optim:
        def __init__(self):
            self.param_groups = [{"lr": 0.5}, {"lr": 0.5}]

    optim = load_config(None, ["actor.optim.lr=1e-3", "actor.optim.lr_scheduler_type=linear"]).actor.optim
    rate, opt = ScheduledRate(optim, total_steps=4), Optim()
    seen = []
    for _ in range(4):
        rate.before_update(opt)
        seen += [g["lr"] for g in opt.param_groups]
    assert seen == pytest.approx([1e-3] * 2 + [7.5e-4] * 2 + [5e-4] * 2 + [2.5e-4] * 2)  # lr * (4 - s) / 4
    constant = ScheduledRate(load_config(None, []).actor.optim, total_steps=4)
    opt = Optim()
    constant.before_update(opt)
    assert opt.param_groups[0]["lr"] == 0.5  # untouched: bitwise the unscheduled run
    assert LRSchedule(lr=2.0, total=4, schedule="cosine")(2) == pytest.approx(2.0 * 0.5 * (1 + math.cos(math.pi / 2)))


@pytest.mark.parametrize("override, message", [
    ("actor.optim.lr_scheduler_type=step", "is not one of constant, cosine, linear"),
    ("actor.optim.min_lr_ratio=1.5", "must be in [0, 1]"),
    ("actor.optim.lr_warmup_steps_ratio=1.0", "must be in [0, 1)"),
    ("critic.optim.num_cycles=0", "must be a finite number > 0"),
])
def test_bad_schedule_settings_fail_at_config_time(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [override])


def test_a_schedule_needs_the_runs_length_and_verl_names_map():
    with pytest.raises(ConfigError, match="needs the run's length"):
        load_config(None, ["actor.optim.lr_scheduler_type=cosine", "trainer.total_training_steps=0",
                           "trainer.total_epochs=2"])
    # a warm-up under the constant schedule is named as itself (verl's search_r1 list got "set
    # lr_scheduler_type=constant" for lr_scheduler_type='constant')
    with pytest.raises(ConfigError, match=r"actor.optim.lr_warmup_steps_ratio=0.285: .*needs the run's length.*"
                                          r"or actor.optim.lr_warmup_steps_ratio=0$"):
        load_config(None, ["actor.optim.lr_warmup_steps_ratio=0.285", "trainer.total_training_steps=0",
                           "trainer.total_epochs=2"])
    cfg = load_config(None, ["actor_rollout_ref.actor.optim.warmup_style=cosine",  # verl's deprecated name
                             "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
                             "actor_rollout_ref.actor.optim.min_lr_ratio=0.1", "critic.optim.lr_scheduler_type=linear"])
    o = cfg.actor.optim
    assert (o.lr_scheduler_type, o.lr_warmup_steps_ratio, o.min_lr_ratio) == ("cosine", 0.1, 0.1)
    assert cfg.critic.optim.lr_scheduler_type == "linear"

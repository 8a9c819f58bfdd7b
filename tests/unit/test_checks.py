"""The run's checks of itself (issue 32, flowrl.checks): each check sees its injected fault
(a stale row, NaN advantages, a constant reward, a dropped token, a slow reward, a rollout whose
log-probs disagree) and names it, and passes on the same table without the fault; the runner's
modes, metrics, health line and stop; the config keys."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from flowrl.checks import CHECKS, CheckFailed, Limits, StepChecks, StepData
from flowrl.checks.runner import START_CHECKS
from flowrl.checks.template import round_trip
from flowrl.checks.tokens import RESPONSE_HASH, response_hashes, row_hashes, with_response_hash
from flowrl.config import ConfigError, load_config
from flowrl.config.checks import ChecksConfig
from flowrl.data import experience as ex
from flowrl.run.health import lag_bound, open_checks

def lists(rows, list_type) -> pa.Array:
    return pa.array([list(r) for r in rows], list_type)


LIMITS = Limits(max_lag=1, lag_source="trainer.staleness=1", no_signal_steps=3, logprob_kl_max=0.1)


def table(scores=(0.0, 1.0, 1.0, 0.0), responses=((5, 6, 7), (8,), (9, 10), (11, 12, 13, 14)), **extra) -> pa.Table:
    """Two groups of two samples; advantages = score - group mean on every response token."""
    scores = np.asarray(scores, np.float32)
    groups = np.array([0, 0, 1, 1])
    means = np.array([scores[groups == g].mean() for g in groups])
    t = pa.table({"uid": [f"u{i}" for i in range(4)], "group": pa.array(groups, pa.int64()),
                  "response_ids": lists([list(r) for r in responses], ex.TOKEN_IDS),
                  "score": pa.array(scores, pa.float32())})
    with np.errstate(invalid="ignore"):  # an inf score: its group's advantages are NaN
        adv = [[float(scores[i] - means[i])] * len(r) for i, r in enumerate(responses)]
    rewards = [[0.0] * (len(r) - 1) + [float(scores[i])] for i, r in enumerate(responses)]  # on the last token
    t = t.append_column("token_rewards", lists(rewards, ex.TOKEN_FLOATS))
    t = t.append_column("advantages", lists(adv, ex.TOKEN_FLOATS))
    for name, column in extra.items():
        t = t.append_column(name, column)
    return t


def run(name: str, t: pa.Table, index: int = 5, metrics=None, memory=None):
    return CHECKS.get(name)(StepData(index, t, metrics or {}), LIMITS, {} if memory is None else memory)


# ----------------------------------------------------------------- staleness (item 3)
def test_staleness_names_the_stale_row_and_passes_within_the_bound():
    # step index 5 trains on version 5: versions 4 and 5 lag 1 and 0 (bound 1); version 3 lags 2
    fresh = table(weight_version=pa.array([5, 4, 5, 4], pa.int64()))
    assert run("staleness", fresh).ok and run("staleness", fresh).value == 1.0
    stale = table(weight_version=pa.array([5, 4, 3, 4], pa.int64()))
    v = run("staleness", stale)
    assert v.ok is False and v.value == 2.0
    assert "1 of 4 trained rows were generated 2 weight versions behind" in v.message
    assert "row 2 (uid u2, group 1) has weight_version 3" in v.message and "trainer.staleness=1" in v.message


def test_staleness_refuses_a_version_from_the_future_and_accepts_inline_steps():
    v = run("staleness", table(weight_version=pa.array([5, 6, 5, 5], pa.int64())))
    assert v.ok is False and "claim weight version 6 at step 6" in v.message
    assert run("staleness", table()).ok  # no weight_version: generated in the step's own graph


def test_the_lag_bound_of_stream_mode_is_the_queue_when_it_holds_fewer_steps():
    base = ["trainer.async_mode=stream", "trainer.staleness=2"]  # data.train_batch_size=64
    assert lag_bound(load_config(None, base)) == (2, "trainer.staleness=2")  # queue (2 + 1) * 64: 2 steps ahead
    bound, why = lag_bound(load_config(None, base + ["trainer.max_queue_size=128"]))  # 128 / 64 - 1 = 1 step ahead
    assert bound == 1 and "trainer.max_queue_size=128" in why
    assert lag_bound(load_config(None, ["trainer.staleness=0"])) == (0, "trainer.staleness=0")


# ----------------------------------------------------------------- reward and data sanity (item 6)
def test_nan_advantages_fail_at_once_naming_the_column_and_row():
    good = table()
    assert run("finite", good).ok
    adv = [[0.5, 0.5, 0.5], [float("nan")], [0.0, 0.0], [float("inf"), 0.0, 0.0, 0.0]]
    bad = good.set_column(good.schema.get_field_index("advantages"), "advantages", lists(adv, ex.TOKEN_FLOATS))
    v = run("finite", bad)
    assert v.ok is False and v.value == 2.0
    assert "advantages has 1 NaN and 1 inf values in 2 rows (first: row 1 (uid u1, group 0))" in v.message
    assert "likely cause" in v.message


def test_a_supervised_batch_has_no_reward_signal_to_judge():
    assert run("reward_signal", table().drop_columns(["token_rewards"])).ok is None
    assert StepChecks({}, LIMITS).observe(0, None, {}).keys() == {"checks/time_s"}


def test_a_nan_score_is_named_before_the_advantages():
    v = run("finite", table(scores=(0.0, float("nan"), 1.0, 0.0)))
    assert v.ok is False and v.message.startswith("score has 1 NaN") and "reward function" in v.message


def test_a_constant_reward_fails_after_k_steps_and_a_varying_one_resets_the_count():
    memory: dict = {}
    zero = table(scores=(0, 0, 0, 0))
    first, second = run("reward_signal", zero, 0, memory=memory), run("reward_signal", zero, 1, memory=memory)
    assert first.ok and second.ok and second.value == 2.0  # 2 of 3 allowed
    third = run("reward_signal", zero, 2, memory=memory)
    assert third.ok is False and "no learning signal: every reward is 0 for 3 steps in a row (step 1..3)" in third.message
    assert run("reward_signal", table(), 3, memory=memory).ok and memory["streak"] == 0
    ones = [run("reward_signal", table(scores=(1, 1, 1, 1)), i, memory=memory) for i in range(4, 7)]
    assert ones[-1].ok is False and "every reward is 1" in ones[-1].message


def test_equal_rewards_within_every_group_are_no_signal_either():
    memory: dict = {}
    same_in_groups = table(scores=(1, 1, 0, 0))  # varies across groups, not within: advantages all 0
    verdicts = [run("reward_signal", same_in_groups, i, memory=memory) for i in range(3)]
    assert verdicts[-1].ok is False and "every advantage is 0: the rewards are equal within each of the 2 groups" in verdicts[-1].message


def test_a_reward_slower_than_generation_is_named_with_both_times():
    fast = run("reward_time", table(), metrics={"timing_s/gen": 2.0, "timing_s/reward": 0.5})
    assert fast.ok and math.isnan(fast.value)  # times are timing_s/*: no run-dependent number under checks/
    memory: dict = {}
    slow = [run("reward_time", table(), i, {"timing_s/gen": 1.0, "timing_s/reward": 3.0}, memory) for i in range(3)]
    assert slow[1].ok and slow[2].ok is False  # one or two slow steps are a loaded machine's noise
    assert "scoring took 3.000s, longer than the generation it scores (1.000s, x3.0), 3 steps in a row" in slow[2].message
    assert run("reward_time", table()).ok is None  # no timings: nothing to compare


# ----------------------------------------------------------------- token-exact trajectories (item 4)
def test_a_dropped_token_is_found_in_its_row():
    generated = with_response_hash(table())
    assert run("tokens", generated).ok
    dropped = [[5, 6, 7], [8], [9, 10], [11, 13, 14]]  # row 3 lost its separator 12
    trained = generated.set_column(generated.schema.get_field_index("response_ids"), "response_ids",
                                   lists(dropped, ex.TOKEN_IDS))
    v = run("tokens", trained)
    assert v.ok is False and v.value == 1.0
    assert "1 of 4 trained rows differ from the tokens the engine generated (first: row 3 (uid u3, group 1), now 3" in v.message


def test_the_hash_tells_apart_order_length_and_position_and_survives_slicing():
    rows = [[1, 2, 3], [3, 2, 1], [1, 2], [1, 2, 3, 0], [], [0], [2, 1, 3]]
    hashes = response_hashes(pa.table({"response_ids": lists(rows, ex.TOKEN_IDS)}))
    assert len(set(hashes.tolist())) == len(rows)
    t = pa.table({"response_ids": lists(rows, ex.TOKEN_IDS)})
    assert response_hashes(t.slice(2, 3)).tolist() == hashes[2:5].tolist()  # offsets rebased
    flat = np.array([1, 2, 3], np.int32)
    assert row_hashes(flat, np.array([0, 3])).tolist() == [hashes[0]]


def test_tables_without_the_hash_are_not_judged():
    assert run("tokens", table()).ok is None
    assert RESPONSE_HASH in with_response_hash(table()).column_names


# ----------------------------------------------------------------- log-prob agreement (item 2)
def test_rollout_logprobs_far_from_the_trainers_raise_the_alarm():
    n = [3, 1, 2, 4]
    mask = lists([[1] * k for k in n], pa.list_(pa.int8()))
    old = lists([[-1.0] * k for k in n], ex.TOKEN_FLOATS)
    near = lists([[-1.01] * k for k in n], ex.TOKEN_FLOATS)
    far = lists([[-3.0] * k for k in n], ex.TOKEN_FLOATS)  # r = 2: exp(2) - 2 - 1 = 4.39 nats
    ok = run("logprob_agreement", table(response_mask=mask, old_logprobs=old, rollout_logprobs=near))
    assert ok.ok and ok.value == pytest.approx(math.exp(0.01) - 0.01 - 1, rel=1e-3)
    bad = run("logprob_agreement", table(response_mask=mask, old_logprobs=old, rollout_logprobs=far))
    assert bad.ok is False and bad.value == pytest.approx(math.exp(2) - 3, rel=1e-4)
    assert "mean per-token KL 4.39 > 0.1" in bad.message and "stale or partial weights" in bad.message
    assert run("logprob_agreement", table()).ok is None  # no old_logprobs this step
    # generated ahead: only the rows of the trainer's current weights (version 5 at index 5) count
    versions = pa.array([5, 4, 4, 4], pa.int64())
    mixed = lists([[-3.0] * 3, [-1.01], [-1.01] * 2, [-1.01] * 4], ex.TOKEN_FLOATS)  # the far row: version 5
    assert run("logprob_agreement", table(response_mask=mask, old_logprobs=old, rollout_logprobs=mixed,
                                          weight_version=versions)).ok is False
    stale_far = lists([[-1.01] * 3, [-3.0], [-3.0] * 2, [-3.0] * 4], ex.TOKEN_FLOATS)  # far rows: version 4
    assert run("logprob_agreement", table(response_mask=mask, old_logprobs=old, rollout_logprobs=stale_far,
                                          weight_version=versions)).ok


# ----------------------------------------------------------------- the runner
def test_error_mode_stops_after_the_step_warn_mode_logs_and_goes_on(caplog):
    checks = StepChecks({"finite": "error", "reward_time": "warn"}, LIMITS)
    slow = {"timing_s/gen": 1.0, "timing_s/reward": 2.0}
    checks.observe(0, table(), slow), checks.observe(1, table(), slow)
    metrics = checks.observe(2, table(), slow)
    assert metrics["checks/finite"] == 0.0 and metrics["checks/reward_time"] == 1.0
    assert "checks/reward_time_value" not in metrics and metrics["checks/time_s"] >= 0
    assert "check reward_time at step 3: scoring took" in caplog.text
    checks.enforce()  # a warning does not stop the run
    assert "reward_time=WARN" in checks.health_line() and "finite=ok" in checks.health_line()
    checks.observe(3, table(scores=(0.0, float("inf"), 1.0, 0.0)), {})
    with pytest.raises(CheckFailed, match=r"check finite failed at step 4: score has 0 NaN and 1 inf .*"
                                          r"trainer.checks.finite=warn to log it and go on"):
        checks.enforce()
    assert "finite=FAIL" in checks.health_line()


def test_off_checks_do_not_run_and_every_check_is_on_the_health_line():
    checks = StepChecks({"tokens": "off"}, LIMITS)
    metrics = checks.observe(0, with_response_hash(table()), {})
    assert "checks/tokens" not in metrics and "checks/staleness" in metrics
    line = checks.health_line()
    assert line.startswith("health: ") and "tokens=off" in line and "logprob_agreement=n/a" in line
    assert [p.split("=")[0] for p in line[len("health: "):].split()] == ["chat_template", "resume", *CHECKS.names()]


def test_a_rewind_counts_on_from_the_checkpoints_streak():
    checks = StepChecks({"reward_signal": "warn"}, LIMITS)
    checks.observe(0, table(scores=(0, 0, 0, 0)), {})
    saved = checks.state_dict()  # what the checkpoint after step 1 keeps
    assert saved == {"reward_signal": {"streak": 1}}
    checks.observe(1, table(scores=(0, 0, 0, 0)), {})
    checks.rewind()
    checks.load_state_dict(saved)  # back to that checkpoint: step 2 again
    checks.observe(1, table(scores=(0, 0, 0, 0)), {})
    assert checks.memory["reward_signal"] == {"streak": 2}  # as if the run never went back
    checks.load_state_dict({})  # back to the initial model: counting starts again
    checks.observe(0, table(scores=(0, 0, 0, 0)), {})
    assert checks.memory["reward_signal"] == {"streak": 1}


def test_unknown_names_and_modes_are_refused():
    with pytest.raises(ValueError, match="unknown check 'nope'; valid: chat_template, engine_moved, finite, logprob_agreement"):
        StepChecks({"nope": "error"}, LIMITS)
    with pytest.raises(ValueError, match="trainer.checks.tokens='loud': not a mode; use one of off, warn, error"):
        StepChecks({"tokens": "loud"}, LIMITS)


# ----------------------------------------------------------------- the config
def test_the_config_names_every_check_with_its_registered_default():
    modes = ChecksConfig().modes()
    defaults = {**{name: CHECKS.traits(name)["default"] for name in CHECKS.names()}, **START_CHECKS}
    assert modes == defaults
    cfg = load_config(None, ["trainer.checks.staleness=warn", "trainer.checks.reward_signal_steps=4"])
    checks = open_checks(cfg)
    assert checks.modes["staleness"] == "warn" and checks.limits.no_signal_steps == 4


def test_a_bare_off_turns_a_check_off_and_on_is_refused():
    assert load_config(None, ["trainer.checks.tokens=off"]).trainer.checks.tokens == "off"  # YAML: false
    with pytest.raises(ConfigError, match="trainer.checks.tokens='on': is not a mode; fix: use warn"):
        load_config(None, ["trainer.checks.tokens=on"])


@pytest.mark.parametrize("item, key, text", [
    ("trainer.checks.tokens=loud", "trainer.checks.tokens", "is not one of off, warn, error"),
    ("trainer.checks.stalenes=warn", "trainer.checks.stalenes", "did you mean trainer.checks.staleness"),
    ("trainer.checks.reward_signal_steps=0", "trainer.checks.reward_signal_steps", "must be an integer >= 1"),
    ("trainer.checks.logprob_kl_max=-1", "trainer.checks.logprob_kl_max", "must be > 0"),
])
def test_bad_check_settings_name_the_key(item, key, text):
    with pytest.raises(ConfigError) as err:
        load_config(None, [item])
    assert key in str(err.value) and text in str(err.value)


def test_flowrl_train_prints_a_failed_check_as_one_error_line():
    from flowrl.cli import _named_error

    failed = CheckFailed("finite", 3, run("finite", table(scores=(0.0, float("nan"), 1.0, 0.0))))
    try:
        raise RuntimeError("the graph failed") from failed
    except RuntimeError as exc:
        assert _named_error(exc) is failed


# ----------------------------------------------------------------- the chat template's round trip (item 4)
# Qwen's shape in the character tokenizer's alphabet: each turn ends with the EOS, then a newline
QWEN_SHAPE = ("{%- for m in messages -%}{{- '<|' + m['role'] + '|>\\n' + m['content'] + '<eos>\\n' -}}{%- endfor -%}"
              "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}")


def test_a_separator_the_turn_by_turn_tokens_lose_is_shown():
    from flowrl.agents.loop import ChatCodec
    from flowrl.tasks.agent_task import build_agent_tokenizer

    tok = build_agent_tokenizer()  # the agent task's template: turns joined as the loop joins them
    assert round_trip(tok, ChatCodec(tok).observation_ids).ok
    tok.chat_template = QWEN_SHAPE  # the newline after each turn's <eos>: the loop's observation carries it
    assert round_trip(tok, ChatCodec(tok).observation_ids).ok
    # the fault: a loop whose observations lose it (the tool's delta alone, as the loop had it before)
    v = round_trip(tok, lambda texts: ChatCodec(tok).observation_ids(texts, after_end=False))
    assert v.ok is False and "after 'ute it.<eos>'): the loop has '<'" in v.message and "the template '\\n'" in v.message
    checks = StepChecks({"chat_template": "error"}, LIMITS)
    with pytest.raises(CheckFailed, match="check chat_template failed at step 0: the agent loop's tokens differ"):
        checks.record("chat_template", v)
    assert "chat_template=FAIL" in checks.health_line()


# ----------------------------------------------------------------- the policy really moved (item 2)
def test_an_engine_that_ignores_the_updates_is_named():
    n = [3, 1, 2, 4]
    mask = lists([[1] * k for k in n], pa.list_(pa.int8()))
    ref = lists([[-1.0] * k for k in n], ex.TOKEN_FLOATS)
    moved = lists([[-1.2] * k for k in n], ex.TOKEN_FLOATS)  # r = 0.2: exp(0.2) - 1.2 = 0.0214 nats
    trainer = {"actor/kl_loss": 0.02}
    ok = run("policy_moved", table(response_mask=mask, ref_logprobs=ref, rollout_logprobs=moved), 3, trainer)
    assert ok.ok and ok.value == pytest.approx((math.exp(0.2) - 1.2) / 0.02, rel=1e-4)
    base = run("policy_moved", table(response_mask=mask, ref_logprobs=ref, rollout_logprobs=ref), 3, trainer)
    assert base.ok is False and "after 3 updates the rollout engine still samples like the reference model" in base.message
    assert "the weight sync does not reach the engine" in base.message
    # nothing to judge: before any update, or a trainer that has not moved yet
    assert run("policy_moved", table(response_mask=mask, ref_logprobs=ref, rollout_logprobs=ref), 0, trainer).ok is None
    assert run("policy_moved", table(response_mask=mask, ref_logprobs=ref, rollout_logprobs=ref), 3,
               {"actor/kl_loss": 1e-5}).ok is None


def test_a_template_that_refuses_a_tool_message_is_not_judged():
    from flowrl.agents.loop import ChatCodec
    from flowrl.tasks.agent_task import build_agent_tokenizer

    tok = build_agent_tokenizer()
    tok.chat_template = ("{%- for m in messages -%}{%- if m['role'] == 'tool' -%}{{ raise_exception('no tools') }}"
                         "{%- endif -%}{{ m['content'] }}{%- endfor -%}")
    v = round_trip(tok, ChatCodec(tok).observation_ids)
    assert v.ok is None and "does not render this conversation" in v.message


def test_an_unknown_check_name_is_refused_with_the_valid_ones():
    from flowrl.config.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config(None, ["trainer.checks.foo=warn"])
    # no "did you mean" from the shared prefix alone: the section's keys, listed
    assert "did you mean" not in str(err.value) and "use one of trainer.checks.{staleness, finite," in str(err.value)
    with pytest.raises(ConfigError, match=r"did you mean trainer\.checks\.staleness\?"):
        load_config(None, ["trainer.checks.stalenes=warn"])

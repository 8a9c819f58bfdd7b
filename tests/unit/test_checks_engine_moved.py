"""The probe of issue 32 item 2 (``trainer.checks.engine_moved``): after each sync every engine
scores a fixed probe batch; when the trainer's weights changed since the last sync the probe's
log-probs must change too. Faults injected: an engine whose sync was written into a copy of its
weights (it keeps sampling the old ones), and the same sync written into the engine itself."""

from __future__ import annotations

import torch

from flowrl.backends.generate.hf import HFGenerator
from flowrl.checks import CHECKS, Limits, StepData
from flowrl.checks import fingerprint as fp
from flowrl.checks.sync import PROBE, TRAINER, probe_logp
from flowrl.nodes.weights import verify_fingerprints

LIMITS = Limits(max_lag=0, lag_source="", no_signal_steps=1, logprob_kl_max=0.1)


def _judge(steps: list[dict]) -> list:
    check, memory = CHECKS.get("engine_moved"), {}
    return [check(StepData(i, None, metrics), LIMITS, memory) for i, metrics in enumerate(steps)]


def _synced(engine: HFGenerator, trainer: dict[str, torch.Tensor], *, into_a_copy: bool) -> dict:
    """A sync of ``trainer``'s weights into ``engine`` (or, the fault, into a copy of them), then
    the metrics the sync node reports for it."""
    target = engine.reshard_target()
    if into_a_copy:
        target = {name: t.clone() for name, t in target.items()}
    for name, t in target.items():
        t.copy_(trainer[name])
    total = sum(v[fp.WHOLE][0] for v in fp.state_fingerprints(trainer).values())
    return {PROBE: probe_logp(engine), TRAINER: float(total)}


def _updated(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: t + 0.05 * torch.randn(t.shape, generator=gen) for n, t in state.items()}


def test_an_engine_that_ignores_the_update_is_named_and_one_that_takes_it_passes(tiny_model_dir):
    for into_a_copy in (True, False):
        engine = HFGenerator(str(tiny_model_dir))
        trainer = {n: t.clone() for n, t in engine.reshard_target().items()}
        steps = [_synced(engine, trainer, into_a_copy=False)]  # the first sync lands (the engine's start)
        for seed in (1, 2):
            trainer = _updated(trainer, seed)
            steps.append(_synced(engine, trainer, into_a_copy=into_a_copy))
        verdicts = _judge(steps)
        assert verdicts[0].ok is None  # nothing to compare with yet
        if into_a_copy:
            assert [v.ok for v in verdicts[1:]] == [False, False]
            assert "fixed probe batch did not" in verdicts[1].message and "old copy" in verdicts[1].message
        else:
            assert [v.ok for v in verdicts[1:]] == [True, True] and verdicts[1].value > 0


def test_a_trainer_that_did_not_move_passes_and_a_step_without_a_probe_is_skipped():
    verdicts = _judge([{PROBE: -3.0, TRAINER: 1.5}, {PROBE: -3.0, TRAINER: 1.5}, {}])
    assert [v.ok for v in verdicts] == [None, True, None]
    assert "did not change since the last sync" in verdicts[1].message


def test_the_sync_node_reports_the_probe_and_the_trainers_total():
    src = fp.report("src", 0, 0, {"w": {"*": (1.5, 2.0)}, "b": {"*": (-0.5, 1.0)}}, dtype="float32")
    dst = fp.report("dst", 0, 0, {"w": {"*": (1.5, 2.0)}, "b": {"*": (-0.5, 1.0)}}, dtype="float32")
    out = verify_fingerprints([{"fingerprint": [src]}, {"fingerprint": [dst], "probe_logp": -7.25}], "warn")
    assert out[PROBE] == -7.25 and out[TRAINER] == 1.0 and out["reshard/fingerprint_mismatch"] == 0
    assert PROBE not in verify_fingerprints([{"fingerprint": [src]}, {"fingerprint": [dst]}], "warn")

"""Weight-sync verification (issue 32 item 1): the fingerprints of both sides of a sync agree
exactly when the weights arrived, and a corrupted bucket, an engine that ignores the update and
a LoRA sync that sends nothing each fail, naming the parameter and the ranks.

The transport runs for real (``run_rank`` / ``run_adapter_rank``) over the in-process stand-in
for the joint gloo group of ``test_lora_sync.py``; the generation side is the real ``hf``
engine on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from flowrl.backends.reshard import AdapterJob, make_job, run_adapter_rank, run_rank
from flowrl.backends.train.lora import sync_names
from flowrl.checks import fingerprint as fp
from flowrl.comm.joint import JointSpec
from flowrl.models.lora import LoraSpec
from flowrl.parallel.mesh import ParallelDims
from flowrl.parallel.shard_spec import shard_arrays
from flowrl_testing import lora_adapters


class _Done:
    def wait(self) -> None:
        pass


class MailboxGroup:
    """``send``/``recv`` of a gloo group within one process (as ``test_lora_sync.py``'s): a send
    completes at once, keeping a copy per (src, dst, tag); a receive takes it."""

    boxes: dict = {}

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def send(self, tensors, dst, tag):  # noqa: ANN001
        MailboxGroup.boxes[(self.rank, dst, tag)] = tensors[0].clone()
        return _Done()

    def recv(self, tensors, src, tag):  # noqa: ANN001
        tensors[0].copy_(MailboxGroup.boxes.pop((src, self.rank, tag)))
        return _Done()


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from flowrl.backends.generate.hf import HFGenerator

    return HFGenerator(str(tiny_model_dir))


def _trained(engine, seed: int) -> dict[str, torch.Tensor]:
    """The trainer's weights after an update: the engine's, each moved a little."""
    gen = torch.Generator().manual_seed(seed)
    return {n: t.clone() + 1e-3 * torch.randn(t.shape, generator=gen) for n, t in engine.reshard_target().items()}


def _job(model_dir, *, src_tp: int, wire: str = "float32"):
    return make_job(_shape(model_dir), src=ParallelDims(dp=1, tp=src_tp, pp=1),
                    dst=ParallelDims(dp=1, tp=1, pp=1), placement="split", src_style="megatron" if src_tp > 1 else "hf",
                    dst_style="hf", joint=JointSpec("t", "h", 1, src_tp + 1), wire_dtype=wire)


def _shape(model_dir):
    from flowrl.parallel.shard_spec import ModelShape

    return ModelShape.from_hf_config(str(model_dir))


def _sync(job, full: dict, engine, *, src_tp: int) -> list[dict]:
    """Every rank's part of a real sync, trainer tp shards -> the hf engine; each rank's report."""
    src_spec = job.specs()[0]
    reports = []
    for r in range(src_tp):
        local = shard_arrays(src_spec, full, src_spec.dims.rank_coords(r)[1:]) if src_tp > 1 else full
        run_rank(job, src_rank=r, src=local, pg=MailboxGroup(r))
        reports.append(fp.source_report(job, r, local))
    target = engine.reshard_target()
    run_rank(job, dst_rank=0, dst=target, pg=MailboxGroup(src_tp))
    reports.append(fp.target_report(job, 0, target, engine=engine))
    return reports


@pytest.mark.parametrize("src_tp", [1, 2])
def test_a_sync_that_arrived_agrees_and_a_corrupted_bucket_is_named(tiny_model_dir, engine, src_tp):
    job = _job(tiny_model_dir, src_tp=src_tp)
    full = _trained(engine, 1)
    mismatches, compared = fp.compare(_sync(job, full, engine, src_tp=src_tp))
    assert mismatches == [] and compared == len(job.specs()[0].params)
    # the fault: one bucket of the transfer lands corrupted (a slice of one parameter zeroed after the send)
    reports = _sync(job, full, engine, src_tp=src_tp)
    name = "model.layers.1.self_attn.q_proj.weight"
    engine.model.get_parameter(name).data[:3].zero_()
    reports[-1] = fp.target_report(job, 0, engine.reshard_target(), engine=engine)
    mismatches, _ = fp.compare(reports)
    assert [m.param for m in mismatches] == [name] and mismatches[0].dst_ranks == (0,)
    assert mismatches[0].src_ranks == tuple(range(src_tp))
    msg = fp.mismatch_message(mismatches, compared)
    assert name in msg and "generation rank" in msg and "trainer.checks.weight_sync" in msg


def test_the_tp_shards_fingerprints_add_up_to_the_whole(tiny_model_dir, engine):
    """f is linear and separable: megatron tp 2 (fused qkv, column and row cuts) sums to hf's whole."""
    full = _trained(engine, 2)
    job = _job(tiny_model_dir, src_tp=2)
    spec = job.specs()[0]
    parts = {}  # parameter -> region -> f, over both ranks (a region both hold, once)
    for r in range(2):
        for name, regions in fp.shard_fingerprints(spec, r, shard_arrays(spec, full, spec.dims.rank_coords(r)[1:])).items():
            parts.setdefault(name, {}).update(regions)
    assert any(len(regions) == 2 for regions in parts.values())  # cut parameters: a region per rank
    whole = fp.state_fingerprints({n: full[n] for n in spec.params})
    for name, regions in whole.items():
        f, s = regions[fp.WHOLE]
        assert math.isclose(sum(v[0] for v in parts[name].values()), f, rel_tol=0, abs_tol=1e-9 * s), name


def test_an_engine_that_ignores_the_update_is_named(tiny_model_dir, engine, monkeypatch):
    """The engine's write target is a copy (a cast that returns new tensors): the transport
    succeeds, the engine keeps the old weights; its own parameters are what is fingerprinted."""
    job = _job(tiny_model_dir, src_tp=1)
    assert fp.compare(_sync(job, _trained(engine, 3), engine, src_tp=1))[0] == []
    live = engine.reshard_target
    monkeypatch.setattr(engine, "reshard_target", lambda: {n: t.clone() for n, t in live().items()})
    mismatches, compared = fp.compare(_sync(job, _trained(engine, 4), engine, src_tp=1))
    assert len(mismatches) == compared  # every parameter is stale
    monkeypatch.undo()
    assert fp.compare(_sync(job, _trained(engine, 4), engine, src_tp=1))[0] == []


def test_a_stale_parameter_is_seen_through_bf16_rounding(tiny_model_dir, engine):
    """A bf16 engine holds the wire's values rounded: the source's rounded fingerprint is exact,
    so one parameter left at the previous step (an update of 1e-3) is still named."""
    job = _job(tiny_model_dir, src_tp=1)
    full = _trained(engine, 5)
    src = fp.source_report(job, 0, full)
    held = {n: t.to(torch.bfloat16) for n, t in full.items()}
    dst = fp.report("dst", 0, 0, fp.state_fingerprints(held), dtype="bfloat16")
    assert fp.compare([src, dst])[0] == []
    name = "model.layers.0.mlp.down_proj.weight"
    held[name] = _trained(engine, 6)[name].to(torch.bfloat16)
    dst = fp.report("dst", 0, 0, fp.state_fingerprints(held), dtype="bfloat16")
    assert [m.param for m in fp.compare([src, dst])[0]] == [name]


SPEC = LoraSpec(rank=4, alpha=8)


def test_a_lora_sync_that_sends_nothing_is_named(tiny_model_dir, monkeypatch):
    """The adapters the engine ranks install against the trainer's; the fault: the trainer sends
    an empty (zero) buffer, as a sender that flattened nothing would."""
    from flowrl.backends.reshard import adapters as adapter_sync

    model = lora_adapters.peft_model(str(tiny_model_dir), SPEC)
    job = AdapterJob(model_path=str(tiny_model_dir), lora=SPEC.to_dict(), src_world_size=1, dst_world_size=2, dst_tp=1)

    def sync() -> list[dict]:
        trained = lora_adapters.set_adapters(model, 7)
        run_adapter_rank(job, src_rank=0, adapters=trained, pg=MailboxGroup(0))
        reports = [fp.adapter_source_report(job, sync_names(trained))]
        for r in range(2):
            _, got = run_adapter_rank(job, dst_rank=r, pg=MailboxGroup(1 + r))
            reports.append(fp.adapter_target_report(job, r, got))
        return reports

    mismatches, compared = fp.compare(sync())
    assert mismatches == [] and compared == len(job.layout())
    flatten = adapter_sync._flatten
    monkeypatch.setattr(adapter_sync, "_flatten", lambda *a: torch.zeros_like(flatten(*a)))
    mismatches, _ = fp.compare(sync())
    assert {m.dst_ranks for m in mismatches} == {(0,), (1,)}  # both engines, each named
    assert any(".lora_A." in m.param for m in mismatches)
    # an engine rank that installed nothing at all
    reports = sync()
    monkeypatch.undo()
    reports = sync()
    reports[2] = fp.adapter_target_report(job, 1, None)
    mismatches, _ = fp.compare(reports)
    assert mismatches and all(m.got is None and m.dst_ranks == (1,) for m in mismatches)
    assert "never reached generation rank [1]" in mismatches[0].describe()


def test_the_node_raises_in_error_mode_and_reports_in_warn_mode():
    from flowrl.nodes.weights import verify_fingerprints

    src = fp.report("src", 0, 0, {"w": {"*": (1.0, 2.0)}}, dtype="float32", rounded={"w": {"*": (1.0, 2.0)}}, seconds=0.01)
    bad = fp.report("dst", 0, 0, {"w": {"*": (1.5, 2.0)}}, dtype="float32", seconds=0.02)
    with pytest.raises(fp.WeightSyncMismatch, match=r"w: generation rank \[0\]"):
        verify_fingerprints([{"fingerprint": [src]}, {"fingerprint": [bad]}], "error")
    out = verify_fingerprints([{"fingerprint": [src]}, {"fingerprint": [bad]}], "warn")
    assert out == {"reshard/fingerprint_params": 1.0, "reshard/fingerprint_mismatch": 1.0, "reshard/fingerprint_s": 0.02}
    good = fp.report("dst", 0, 0, {"w": {"*": (1.0, 2.0)}}, dtype="float32")
    assert verify_fingerprints([{"fingerprint": [src]}, {"fingerprint": [good]}], "error")["reshard/fingerprint_mismatch"] == 0
    assert verify_fingerprints([{"fingerprint": [src]}, {"fingerprint": [bad]}], "off") == {}


def test_the_weight_sync_check_reads_the_syncs_metrics():
    from flowrl.checks import CHECKS, Limits, StepData

    check = CHECKS.get("weight_sync")
    limits = Limits(max_lag=0, lag_source="", no_signal_steps=1, logprob_kl_max=0.1)
    assert check(StepData(1, None, {}), limits, {}).ok is None
    assert check(StepData(1, None, {"reshard/fingerprint_params": 30.0, "reshard/fingerprint_mismatch": 0.0}), limits, {}).ok
    bad = check(StepData(1, None, {"reshard/fingerprint_params": 30.0, "reshard/fingerprint_mismatch": 2.0}), limits, {})
    assert bad.ok is False and "2 of 30 parameters" in bad.message


def test_the_mismatch_error_is_the_checks_error_and_crosses_processes():
    """Raised in the sync node, on the controller worker: it pickles, and the run (and ``flowrl
    train``'s one-line error) sees a failed check, not a crash to recover from."""
    import pickle

    from flowrl.checks import CheckFailed
    from flowrl.cli import _named_error

    err = pickle.loads(pickle.dumps(fp.WeightSyncMismatch("check weight_sync failed after the weight sync: w differs")))
    assert isinstance(err, CheckFailed) and err.name == "weight_sync" and str(err).endswith("w differs")
    assert _named_error(RuntimeError("graph failed").with_traceback(None)) is None
    wrapped = RuntimeError("step failed")
    wrapped.__cause__ = err
    assert _named_error(wrapped) is err

"""The LoRA weight sync (issue 17): with ``model.lora_rank`` > 0 and ``rollout.name=vllm`` the job
moves the adapters only (``AdapterJob``), trainer rank 0 -> every engine rank, exactly the
adapters' bytes; ``hf`` keeps the merged weights of the planned reshard. The transport runs here
over an in-process stand-in for the joint gloo group (the real one: ``tests/vllm_env/check_lora_grpo.py``)."""

from __future__ import annotations

import pytest
import torch

from flowrl.backends.reshard import AdapterJob, ReshardJob, job_for_run, run_adapter_rank, takes_adapters
from flowrl.backends.train.lora import adapter_layout
from flowrl.config import load_config
from flowrl.models.lora import LoraSpec, adapter_checkpoint_tensors
from flowrl_testing import lora_adapters

SPEC = LoraSpec(rank=4, alpha=8)


class _Done:
    def wait(self) -> None:
        pass


class MailboxGroup:
    """``send``/``recv`` of a gloo group within one process: sends complete at once (a copy kept
    per (src, dst, tag)), a receive takes it. Counts the bytes that went out."""

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
def model(tiny_model_dir):
    return lora_adapters.peft_model(str(tiny_model_dir), SPEC)


def _job(model_dir, *, src=2, dst=4, tp=2) -> AdapterJob:
    return AdapterJob(model_path=str(model_dir), lora=SPEC.to_dict(), src_world_size=src, dst_world_size=dst, dst_tp=tp)


def test_layout_is_the_trainers_adapters_by_peft_saved_names(tiny_model_dir, model):
    layout = adapter_layout(str(tiny_model_dir), SPEC.to_dict())
    trainer = adapter_checkpoint_tensors(lora_adapters.set_adapters(model, 0))
    assert [n for n, _ in layout] == list(trainer)  # the model's parameter order
    assert all(tuple(trainer[n].shape) == s for n, s in layout)
    # tiny model: 2 layers x 7 linear layers (q k v o gate up down), an A and a B each
    assert len(layout) == 2 * 7 * 2 and layout[0][0].startswith("base_model.model.model.layers.0.")


def test_engine_ranks_receive_exactly_the_adapters(tiny_model_dir, model):
    adapters = lora_adapters.set_adapters(model, 1)
    job = _job(tiny_model_dir)  # 2 trainer ranks; 4 generation ranks at tp 2: engines on ranks 0 and 2
    assert job.receivers() == [2, 4]
    want = adapter_checkpoint_tensors(adapters)
    nbytes = sum(t.numel() * 4 for t in want.values())
    assert job.adapter_bytes() == nbytes
    sent, _ = run_adapter_rank(job, src_rank=0, adapters=adapters, pg=MailboxGroup(0))
    idle, none = run_adapter_rank(job, src_rank=1, adapters=adapters, pg=MailboxGroup(1))
    assert sent["bytes_sent"] == 2 * nbytes and idle["bytes_sent"] == 0 and none is None
    stats = []
    for r in range(4):
        s, got = run_adapter_rank(job, dst_rank=r, pg=MailboxGroup(2 + r))
        stats.append(s)
        if r % 2:
            assert got is None and s["bytes_received"] == 0  # tp rank 1: no engine
        else:
            assert list(got) == list(want)
            for name in want:
                torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)
    assert MailboxGroup.boxes == {}
    # what nodes.reshard_metrics reports: reshard/bytes = the adapters once per engine
    assert sum(s["bytes_received"] for s in stats) == 2 * nbytes
    assert sum(s["bytes_min"] for s in stats) == 2 * nbytes


def test_adapters_of_another_model_are_refused(tiny_model_dir, model):
    adapters = lora_adapters.set_adapters(model, 2)
    adapters.pop(next(iter(adapters)))
    with pytest.raises(ValueError, match="missing"):
        run_adapter_rank(_job(tiny_model_dir), src_rank=0, adapters=adapters, pg=MailboxGroup(0))


@pytest.mark.parametrize("rollout, lora_rank, want", [
    ("vllm", 8, AdapterJob),  # LoRA into vLLM: the adapters
    ("hf", 8, ReshardJob),  # hf: merged weights, planned
    ("vllm", 0, ReshardJob),  # no LoRA: every weight
])
def test_job_for_run_sends_adapters_to_vllm_only(tiny_model_dir, rollout, lora_rank, want):
    cfg = load_config(None, [f"model.path={tiny_model_dir}", f"rollout.name={rollout}", f"model.lora_rank={lora_rank}",
                             "rollout.data_parallel_size=1", "actor.data_parallel_size=2"])
    job = job_for_run(cfg)
    assert isinstance(job, want)
    assert takes_adapters(rollout) == (rollout == "vllm")
    if want is AdapterJob:
        assert job.lora == {"rank": 8, "alpha": 16, "target_modules": "all-linear"}
        assert (job.src_world_size, job.dst_world_size, job.joint.world_size) == (2, 1, 3)

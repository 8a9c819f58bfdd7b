"""GRPO with LoRA and ``rollout.name=vllm`` (CPU build), issue 17: the engine reads the base weights
once at its start, and each weight sync sends only the adapters, installed as the engine's LoRA
adapter. Checks: ``reshard/bytes`` of every sync equals the adapters' bytes (a fraction of the
model's); the engine's log-probs equal the trainer's at every step; after the last step the
engine's log-probs of a fixed prompt and response equal those of the ``hf`` backend on the merged
weights ``W + (alpha/r) B A`` and differ from the base model's (the adapter arrived). Twice: LoRA
alone, and with ``model.modules_to_save=embed_tokens`` (the tied embedding trained whole: it
travels with the adapters, loaded in place), with the engine in a process of its own
(``cluster.placement=colocated``: the adapters cross processes); and LoRA alone with the engine in
the trainer's process (``cluster.placement=hybrid``, issue 29: each process installs the adapters
in its own engine, nothing crosses processes, what it holds for the sync is the adapters' bytes).
Runs in the vLLM environment (``test_vllm_env.py``)."""

import os
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from flowrl.backends.generate.hf import HFGenerator
from flowrl.config import load_config
from flowrl.tasks.default_task import prepare_default_task
from flowrl.models.lora import LoraSpec, is_adapter
from flowrl.run import Run, resolve_inputs
from flowrl_testing import lora_adapters

STEPS = 4
SPECS = {"adapters": LoraSpec(rank=8, alpha=16),
         "embed_tokens": LoraSpec(rank=8, alpha=16, modules_to_save=("embed_tokens",))}
PROMPT_RESPONSE = 12  # tokens of the fixed response


@pytest.fixture(scope="module")
def task():
    cache = Path(os.environ.get("FLOWRL_CACHE_DIR", Path.home() / ".cache" / "flowrl"))
    return prepare_default_task(cache / "default_task_vllm", preset="vllm")  # head_dim 32: vLLM's CPU attention


CASES = [("adapters", "colocated"), ("embed_tokens", "colocated"), ("adapters", "hybrid")]


@pytest.fixture(scope="module", params=CASES, ids=["-".join(c) for c in CASES])
def case(request):
    return request.param


@pytest.fixture(scope="module")
def spec(case):
    return SPECS[case[0]]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory, task, spec, case):
    """A short run through the Python API; the rollout's and the trainer's view after it."""
    out = tmp_path_factory.mktemp("lora_vllm") / "run"
    save = ",".join(spec.modules_to_save)
    cfg = resolve_inputs(load_config(None, [
        f"model.path={task.model_dir}", f"data.train_files={task.train_path}", f"trainer.run_dir={out}",
        "rollout.name=vllm", "rollout.enforce_eager=true", "rollout.data_parallel_size=1", f"cluster.placement={case[1]}",
        "actor.data_parallel_size=1", f"trainer.total_training_steps={STEPS}", "data.train_batch_size=16",
        "rollout.n=4", "actor.ppo_mini_batch_size=8", "trainer.progress=false",
        f"model.lora_rank={spec.rank}", f"model.lora_alpha={spec.alpha}", "actor.optim.lr=2e-2",  # moves fast
    ] + ([f"model.modules_to_save={save}"] if save else [])))
    run = Run.open(cfg)
    try:
        rows = [run.step()[1] for _ in range(STEPS)]
        rows.append(run.sync.take())  # the last step's sync
        prompt = pa.table({"prompt_ids": [[3, 4, 5, 6, 7, 8]], "response_ids": [list(range(10, 10 + PROMPT_RESPONSE))]})
        rollout, actor = run.groups["rollout"], run.groups["actor"]
        (engine_logp,), _ = rollout.run(rollout.reserve(), "compute_logprobs", prompt)  # after the last sync
        (merged,), _ = actor.run(actor.reserve(), "hf_state_dict")
    finally:
        run.close()
    logp = torch.tensor(engine_logp.column("gen_logprobs").to_pylist()[0])
    return rows, prompt, logp, merged


def _hf_logprobs(model_dir, state, prompt):
    hf = HFGenerator(str(model_dir))
    if state is not None:
        hf.load_hf_state(state)
    (logp,) = hf.logprobs(prompt.column("prompt_ids").to_pylist(), prompt.column("response_ids").to_pylist(),
                          temperature=1.0)
    return torch.tensor(logp)


def test_each_sync_sends_the_adapters_only(task, outcome, spec, case):
    rows = outcome[0]
    model = lora_adapters.peft_model(str(task.model_dir), spec)
    # what trains: the adapters (and the modules_to_save copies), against the base weights
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if p.requires_grad)
    model_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                      if not is_adapter(n) and ".modules_to_save." not in n)
    synced = [r["reshard/bytes"] for r in rows if "reshard/bytes" in r]
    held = [r["reshard/peak_extra_bytes"] for r in rows if "reshard/peak_extra_bytes" in r]
    print(f"reshard/bytes per sync {synced}, held {held}; adapters {adapter_bytes} B, base model {model_bytes} B")
    assert len(synced) == STEPS  # one sync per step (the first collected with step 1)
    if case[1] == "hybrid":  # in the process: nothing between processes, the adapters held once
        assert all(b == 0 for b in synced) and all(h == adapter_bytes for h in held), (synced, held, adapter_bytes)
        assert all(r["reshard/fingerprint_mismatch"] == 0 and r["reshard/fingerprint_params"] > 0
                   for r in rows if "reshard/bytes" in r)
        # the memory line is reported for the adapter sync too (check_grpo.py asserts its bound)
        assert all(r["perf/hybrid_peak_over_state_and_kv"] > 1.0 and r["perf/hybrid_kv_cache_bytes"] > 0
                   for r in rows if "reshard/bytes" in r)
    else:
        assert all(b == adapter_bytes for b in synced), (synced, adapter_bytes)
        assert all(r["reshard/bytes_min"] == adapter_bytes for r in rows if "reshard/bytes_min" in r)
    assert adapter_bytes < model_bytes / 4


def test_engine_logprobs_equal_the_trainers_every_step(outcome):
    diffs = [r["rollout/logprob_diff_max"] for r in outcome[0][:STEPS]]
    print(f"rollout/logprob_diff_max per step {diffs}")
    assert max(diffs) < 1e-4, diffs


def test_engine_with_adapter_equals_hf_on_merged_weights(task, outcome):
    _, prompt, engine, merged = outcome
    want = _hf_logprobs(task.model_dir, merged, prompt)
    base = _hf_logprobs(task.model_dir, None, prompt)
    print(f"fixed prompt: |vLLM adapter - hf merged| max {float((engine - want).abs().max()):.2e}, "
          f"|merged - base| max {float((want - base).abs().max()):.2e}")
    torch.testing.assert_close(engine, want, atol=1e-4, rtol=0)
    assert float((want - base).abs().max()) > 1e-2  # the adapters changed the policy, and reached vLLM

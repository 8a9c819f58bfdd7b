"""The tiny MoE (Qwen3-MoE preset) under the dp and fsdp trainers: FSDP2 at 2 ranks equals dp on
one process (old log-probs, one step's loss, parameters), with and without routing replay and
with the router losses on; a sharded FSDP2 checkpoint resumes under dp exactly; the dp trainer's
weights sync into the hf generator (fused expert tensors by the model's own names)."""

import numpy as np
import pytest
import torch

from flowrl_testing.fsdp import load_and_report, run_cases, run_ranks, save_after_step
from flowrl_testing.moe import build_moe_dir, moe_step, rollout_table


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return build_moe_dir(tmp_path_factory.mktemp("tiny_moe"))


@pytest.fixture(scope="module")
def table(moe_dir):
    return rollout_table(moe_dir)


@pytest.fixture(scope="module")
def dp(moe_dir, table):
    return {replay: moe_step(0, 1, moe_dir, "dp", table, replay) for replay in (False, True)}


@pytest.fixture(scope="module")
def at2(moe_dir, table, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt") / "step_000001")
    out = run_cases(2, [(moe_step, (moe_dir, "fsdp", table, False)), (moe_step, (moe_dir, "fsdp", table, True)),
                        (save_after_step, (moe_dir, table, path))])
    return {False: out[0], True: out[1], "saved": out[2]}


@pytest.mark.parametrize("replay", [False, True])
def test_fsdp_at_2_ranks_equals_dp_on_the_moe(dp, at2, replay):
    ref, fsdp = dp[replay], at2[replay]
    logp_diff = max(float(np.abs(r["logp"] - ref["logp"]).max()) for r in fsdp)
    state = fsdp[0]["state"]
    param_diff = max(float((state[k] - ref["state"][k]).abs().max()) for k in ref["state"])
    print(f"moe replay={replay}: max |logp - dp| = {logp_diff:.2e}, max |param - dp| = {param_diff:.2e}")
    assert logp_diff <= 1e-5 and param_diff <= 1e-5
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/moe/load_balancing_loss",
                "actor/moe/z_loss", "actor/moe/expert_load_max_over_mean"):
        assert fsdp[0]["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-6), key
    assert ("actor/moe/replayed_fraction" in ref["metrics"]) == replay


def test_replay_changes_the_step_only_through_routing(dp):
    """Replay at the generation weights: the old log-probs equal the plain ones (same routes)."""
    assert float(np.abs(dp[True]["logp"] - dp[False]["logp"]).max()) < 1e-5


def test_fsdp_checkpoint_of_the_moe_resumes_under_dp(moe_dir, at2):
    saved = at2["saved"][0]
    loaded = run_ranks(1, load_and_report, moe_dir, "dp", saved["saved"]["path"], timeout_s=300)[0]
    assert set(loaded["state"]) == set(saved["state"])
    assert any(".mlp.experts." in k for k in loaded["state"]) and any(".mlp.gate." in k for k in loaded["state"])
    for k, v in saved["state"].items():
        assert torch.equal(loaded["state"][k], v), k
    for key, states in saved["optim"].items():
        for k, v in states.items():
            assert torch.equal(loaded["optim"][key][k], v), (key, k)


def test_dp_weights_sync_into_hf_generation(moe_dir, dp, table):
    """The trained state (after one step) loaded into the hf generator: its teacher-forced
    log-probs equal the trainer's log-probs of the same weights."""
    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.train.dp_policy import TorchDPEngine
    from flowrl.data.packed import PackedBatch

    state = dp[False]["state"]
    gen = HFGenerator(moe_dir)
    gen.load_hf_state(state)
    engine = TorchDPEngine(moe_dir, trainable=False)
    engine.load_checkpoint({n: state[n] for n, _ in engine.model.named_parameters()})
    prompts, responses = table.column("prompt_ids").to_pylist(), table.column("response_ids").to_pylist()
    hf = np.concatenate(gen.logprobs(prompts, responses))
    trainer, _ = engine.forward_logprobs(PackedBatch.from_table(table), micro_batch_size=4)
    assert float(np.abs(hf - trainer.numpy()).max()) < 1e-5

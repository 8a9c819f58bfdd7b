"""The fsdp backend (FSDP2 ``fully_shard`` over gloo): the dp backend's numbers at 1, 2 and 4
ranks, for Llama, Qwen2, Qwen3, Mistral and GPT-2; every rank holds 1/world of the state."""

import pytest
import torch

from flowrl_testing.fsdp import FAMILIES, batch, build_family_dir, load_and_report, policy_step, run_ranks, save_after_step


def _dp_reference(model_dir, table):
    return policy_step(0, 1, str(model_dir), "dp", table)


def _check_parity(fsdp: list[dict], dp: dict) -> tuple[float, float]:
    logp_diff = max(float((r["logp"] - dp["logp"]).abs().max()) for r in fsdp)
    state = fsdp[0]["state"]
    assert set(state) == set(dp["state"])
    param_diff = max(float((state[k] - dp["state"][k]).abs().max()) for k in state)
    assert logp_diff <= 1e-6, logp_diff
    assert param_diff <= 1e-5, param_diff
    assert all(r["state"] is None for r in fsdp[1:])  # the full state lives on rank 0 only
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert fsdp[0]["metrics"][key] == pytest.approx(dp["metrics"][key], rel=1e-5, abs=1e-6), key
    return logp_diff, param_diff


@pytest.mark.parametrize("world", [1, 2, 4])
def test_fsdp_matches_dp(tiny_model_dir, world):
    table = batch()
    dp = _dp_reference(tiny_model_dir, table)
    fsdp = run_ranks(world, policy_step, str(tiny_model_dir), "fsdp", table)
    logp_diff, param_diff = _check_parity(fsdp, dp)
    print(f"fsdp world={world}: max |logp - dp| = {logp_diff:.2e}, max |param - dp| after one step = {param_diff:.2e}")
    total = sum(r["bytes"]["params"] for r in fsdp)  # each parameter once over the ranks
    assert max(r["bytes"]["params"] for r in fsdp) <= total / world * 1.2 + 1024


@pytest.mark.parametrize("family", FAMILIES)
def test_fsdp_any_causal_lm(tmp_path, family):
    model_dir = build_family_dir(tmp_path / family, family)
    table = batch()
    dp = _dp_reference(model_dir, table)
    _check_parity(run_ranks(2, policy_step, str(model_dir), "fsdp", table), dp)


def _assert_equal(a: dict, b: dict, what: str) -> None:
    assert set(a) == set(b), what
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k}"


def test_fsdp_checkpoint_resumes_under_another_world_and_dp(tiny_model_dir, tmp_path):
    from flowrl.checkpoint import load_meta

    table = batch()
    path = str(tmp_path / "ckpt" / "step_000001")
    saved = run_ranks(2, save_after_step, str(tiny_model_dir), table, path)
    assert saved[0]["saved"]["optim_step"] == 1 and saved[1]["saved"] is None
    meta = load_meta(saved[0]["saved"]["path"])
    assert meta["extra"]["optim_step"] == 1
    at4 = run_ranks(4, load_and_report, str(tiny_model_dir), "fsdp", saved[0]["saved"]["path"])
    dp = load_and_report(0, 1, str(tiny_model_dir), "dp", saved[0]["saved"]["path"])
    assert at4[0]["step"] == dp["step"] == 1
    expected = {k: v for k, v in saved[0]["state"].items()}
    _assert_equal(at4[0]["state"], expected, "fsdp world 4")
    _assert_equal(dp["state"], expected, "dp")
    for key in ("exp_avg", "exp_avg_sq"):
        _assert_equal(at4[0]["optim"][key], saved[0]["optim"][key], f"fsdp world 4 {key}")
        _assert_equal(dp["optim"][key], saved[0]["optim"][key], f"dp {key}")

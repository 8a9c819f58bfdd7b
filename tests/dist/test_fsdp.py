"""The fsdp backend (FSDP2 ``fully_shard`` over gloo): the dp backend's numbers at 1, 2 and 4
ranks, for Llama, Qwen2, Qwen3, Mistral and GPT-2; every rank holds 1/world of the state;
checkpoints across world sizes and dp; LoRA (adapters only in AdamW, the reference with adapters
disabled, merged weights out, adapter checkpoints across world sizes and dp).

Each world size is one spawn of ranks running all its cases in one process group (the module's
fixtures), so the imports and the rendezvous are paid three times, not once per case."""

import pytest
import torch

from flowrl_testing.fsdp import (FAMILIES, LORA, batch, build_family_dir, load_and_report, lora_load, lora_step,
                                 policy_step, run_cases, save_after_step)


@pytest.fixture(scope="module")
def table():
    return batch()


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    return {f: str(build_family_dir(tmp_path_factory.mktemp(f), f)) for f in FAMILIES}


@pytest.fixture(scope="module")
def dp(tiny_model_dir, table):
    """The dp strategy's log-probs and state after one step, on one process."""
    return policy_step(0, 1, str(tiny_model_dir), "dp", table)


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt")


@pytest.fixture(scope="module")
def at2(tiny_model_dir, family_dirs, table, ckpt_dir):
    """Every 2-rank case: parity on the tiny model and each family, a checkpoint, LoRA."""
    tiny = str(tiny_model_dir)
    jobs = [(policy_step, (tiny, "fsdp", table))]
    jobs += [(policy_step, (family_dirs[f], "fsdp", table)) for f in FAMILIES]
    jobs += [(save_after_step, (tiny, table, str(ckpt_dir / "full" / "step_000001"))),
             (lora_step, (tiny, "fsdp", table, str(ckpt_dir / "lora" / "step_000001")))]
    out = run_cases(2, jobs)
    return {"parity": out[0], **{f: out[1 + i] for i, f in enumerate(FAMILIES)}, "saved": out[-2], "lora": out[-1]}


@pytest.fixture(scope="module")
def at4(tiny_model_dir, table, at2):
    """Every 4-rank case: parity, and the 2-rank checkpoints (full and LoRA) restored."""
    tiny = str(tiny_model_dir)
    out = run_cases(4, [(policy_step, (tiny, "fsdp", table)),
                        (load_and_report, (tiny, "fsdp", at2["saved"][0]["saved"]["path"])),
                        (lora_load, (tiny, "fsdp", at2["lora"][0]["saved"]["path"]))])
    return {"parity": out[0], "loaded": out[1], "lora_loaded": out[2]}


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
def test_fsdp_matches_dp(request, tiny_model_dir, table, dp, world):
    fsdp = (run_cases(1, [(policy_step, (str(tiny_model_dir), "fsdp", table))])[0] if world == 1
            else request.getfixturevalue(f"at{world}")["parity"])
    logp_diff, param_diff = _check_parity(fsdp, dp)
    print(f"fsdp world={world}: max |logp - dp| = {logp_diff:.2e}, max |param - dp| after one step = {param_diff:.2e}")
    total = sum(r["bytes"]["params"] for r in fsdp)  # each parameter once over the ranks
    assert max(r["bytes"]["params"] for r in fsdp) <= total / world * 1.2 + 1024


@pytest.mark.parametrize("family", FAMILIES)
def test_fsdp_any_causal_lm(family_dirs, table, at2, family):
    _check_parity(at2[family], policy_step(0, 1, family_dirs[family], "dp", table))


def _assert_equal(a: dict, b: dict, what: str) -> None:
    assert set(a) == set(b), what
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k}"


def test_fsdp_checkpoint_resumes_under_another_world_and_dp(tiny_model_dir, at2, at4):
    from flowrl.checkpoint import load_meta

    saved = at2["saved"]
    assert saved[0]["saved"]["optim_step"] == 1 and saved[1]["saved"] is None
    meta = load_meta(saved[0]["saved"]["path"])
    assert meta["extra"]["optim_step"] == 1 and "lora" not in meta["extra"]
    dp = load_and_report(0, 1, str(tiny_model_dir), "dp", saved[0]["saved"]["path"])
    at4 = at4["loaded"]
    assert at4[0]["step"] == dp["step"] == 1
    _assert_equal(at4[0]["state"], saved[0]["state"], "fsdp world 4")
    _assert_equal(dp["state"], saved[0]["state"], "dp")
    for key in ("exp_avg", "exp_avg_sq"):
        _assert_equal(at4[0]["optim"][key], saved[0]["optim"][key], f"fsdp world 4 {key}")
        _assert_equal(dp["optim"][key], saved[0]["optim"][key], f"dp {key}")


# --------------------------------------------------------------------------- LoRA
def test_lora_fsdp_matches_dp_and_trains_only_adapters(tiny_model_dir, table, dp, at2):
    fsdp = at2["lora"]
    lora_dp = lora_step(0, 1, str(tiny_model_dir), "dp", table)
    assert max(float((r["logp"] - lora_dp["logp"]).abs().max()) for r in fsdp) <= 1e-6
    state = fsdp[0]["state"]  # merged, under the plain model's names
    assert set(state) == set(dp["state"]) and fsdp[1]["state"] is None
    assert max(float((state[k] - lora_dp["state"][k]).abs().max()) for k in state) <= 1e-5
    # the weight sync sends the plain model's parameters (the tiny model's head is tied: not twice)
    assert fsdp[0]["source"] == sorted(set(dp["state"]) - {"lm_head.weight"})
    # the reference (adapters disabled) is the base model: the plain dp log-probs before its update
    for r in fsdp:
        ref = torch.tensor([x for row in r["ref"] for x in row])
        assert float((ref - dp["logp"]).abs().max()) <= 1e-6
    adapters = fsdp[0]["optimized"]
    assert adapters == lora_dp["optimized"] and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    # AdamW holds exp_avg + exp_avg_sq of the adapters only, sharded: the adapters' bytes per rank
    adapter_bytes = lora_dp["adapter_bytes"]
    assert fsdp[0]["adapter_bytes"] == adapter_bytes  # numel of a DTensor: the whole parameter's
    assert sum(r["bytes"]["optim"] for r in fsdp) == 2 * adapter_bytes == lora_dp["bytes"]["optim"]
    full_optim = sum(r["bytes"]["optim"] for r in at2["parity"])
    print(f"AdamW state over 2 ranks: LoRA rank {LORA['rank']} {2 * adapter_bytes} B, full {full_optim} B")
    assert 2 * adapter_bytes < full_optim / 3


def test_lora_checkpoint_holds_adapters_and_resumes_under_another_world_and_dp(tiny_model_dir, at2, at4):
    from flowrl.checkpoint import load_meta

    saved = at2["lora"][0]
    meta = load_meta(saved["saved"]["path"])
    assert meta["extra"]["lora"] == LORA and set(meta["params"]) == set(saved["optimized"])
    dp = lora_load(0, 1, str(tiny_model_dir), "dp", saved["saved"]["path"])
    assert dp["step"] == at4["lora_loaded"][0]["step"] == 1
    _assert_equal(at4["lora_loaded"][0]["state"], saved["state"], "lora fsdp world 4")
    _assert_equal(dp["state"], saved["state"], "lora dp")
    assert set(dp["optim"]["exp_avg"]) == set(saved["optimized"])
    with pytest.raises(ValueError, match="holds LoRA adapters"):
        load_and_report(0, 1, str(tiny_model_dir), "dp", saved["saved"]["path"])

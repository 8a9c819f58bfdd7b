"""Megatron expert parallelism on CPU over gloo: the tiny Qwen3-MoE (and Mixtral) against
transformers and against megatron on one rank.

For each layout (EP 2 = dp 2 x ep 2; EP 2 x TP 2 = dp 2 x tp 2 x ep 2 x etp 2, sequence parallel;
EP 2 x PP 2 = dp 2 x pp 2 x ep 2): token log-probs and entropies (temperature 1 and 0.7) equal
transformers' within 1e-5; after one step on the same global batch the clipped gradient of every
parameter, gathered back to the checkpoint's per-expert names, equals transformers' autograd
gradient (clipped the same way) and the single-rank megatron gradient within 1e-5; the state after
the AdamW step equals the reference's; dense replicas agree over dp, experts over expert-dp; each
layer's expert load imbalance (max / mean tokens per expert) equals the one counted from
transformers' own router logits, and no token is dropped.

With ``moe_aux_loss_coeff`` (at one rank and at EP 2) the gradient is that of the policy loss plus
the coefficient times megatron's switch load-balancing loss written out from transformers' router
logits (per micro-batch, mean over micro-batches and dp ranks), and the logged
``moe/load_balancing_loss`` equals that loss per layer.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("megatron.core")

from flowrl.comm import free_port  # noqa: E402
from flowrl_testing import megatron as testing  # noqa: E402
from flowrl_testing import megatron_moe as moe_testing  # noqa: E402

TOL = 1e-5
AUX = 0.1  # moe_aux_loss_coeff of the load-balancing runs
Z = 0.01  # moe_z_loss_coeff of the one-rank one


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_moe")
    out = {"root": root}
    for arch in ("qwen3_moe", "mixtral"):
        aux = {"aux_dp1": dict(aux_coeff=AUX, z_coeff=Z, dp=1), "aux_dp2": dict(aux_coeff=AUX, dp=2)} \
            if arch == "qwen3_moe" else None
        ref = moe_testing.prepare(str(root / arch), str(root / f"{arch}.pt"), arch=arch, aux=aux)
        out[arch] = {"model_dir": str(root / arch), "ref_path": str(root / f"{arch}.pt"),
                     "grad_norm": ref["grad_norm"]}
    return out


def launch(models, world_size: int, jobs: list[dict]) -> list[dict]:
    out_path = models["root"] / f"results_w{world_size}.json"
    jobs = [{**{k: v for k, v in models[job.pop("model")].items() if k != "grad_norm"}, **job}
            for job in jobs]
    testing.spawn(moe_testing.layouts_worker, world_size=world_size,
                  args=(world_size, free_port(), jobs, str(out_path)), timeout_s=400)
    return json.loads(out_path.read_text())


def job(name, model, *, dp, tp=1, pp=1, ep, **kwargs):
    return {"name": name, "model": model, "dp": dp, "tp": tp, "pp": pp, "ep": ep, **kwargs}


def assert_parity(models, results: list[dict]) -> None:
    print(f"\n{'layout':<26}{'logp':>10}{'entropy':>10}{'grad':>10}{'grad/w1':>10}{'state':>10}"
          f"{'|dgnorm|':>10}{'|dloss|':>10}{'imbal':>10}{'s':>6}")
    for r in results:
        print(f"{r['name']:<26}{max(r['logp@1.0'], r['logp@0.7']):>10.2e}"
              f"{max(r['entropy@1.0'], r['entropy@0.7']):>10.2e}{r['grad']:>10.2e}"
              f"{r.get('grad_vs_world1', 0.0):>10.2e}{r['state']:>10.2e}{r['grad_norm']:>10.2e}"
              f"{r['loss']:>10.2e}{r['imbalance']:>10.2e}{r['seconds']:>6.1f}")
    for r in results:
        ref_norm = models["mixtral" if "mixtral" in r["name"] else "qwen3_moe"]["grad_norm"]
        assert max(r["logp@1.0"], r["logp@0.7"]) <= TOL, r
        assert max(r["entropy@1.0"], r["entropy@0.7"]) <= TOL, r
        assert r["grad"] <= TOL and r["grad_scale"] > 100 * TOL, r  # gradients far above the tolerance
        if "grad_vs_world1" in r:  # the jobs given ref_grads_path: every multi-rank one without aux
            assert r["grad_vs_world1"] <= TOL, r
        if "lb_loss" in r:  # the moe_aux_loss_coeff jobs
            assert r["lb_loss"] <= TOL, r
        if "z_loss" in r:  # relative: logsumexp^2 of the router logits is O(10)
            assert r["z_loss"] <= TOL, r
        assert r["state"] <= TOL, r
        assert r["grad_norm"] <= TOL * ref_norm, r
        assert r["loss"] <= TOL, r
        assert r["dp_identical"], r
        assert r["imbalance"] <= 1e-12, r
        assert r["moe_stats"]["moe/dropped_tokens"] == 0.0, r
        assert r["moe_stats"]["moe/expert_load_imbalance"] > 1.0, r  # routing is not uniform


def test_moe_one_rank(models):
    """megatron on one rank (every expert local) against transformers; saves its gradients."""
    root = models["root"]
    results = launch(models, 1, [
        job("(1,1,1,ep1) qwen3_moe", "qwen3_moe", dp=1, ep=1, grads_path=str(root / "qwen3_moe_w1.grads")),
        job("(1,1,1,ep1) mixtral", "mixtral", dp=1, ep=1, grads_path=str(root / "mixtral_w1.grads")),
        job("(1,1,1,ep1) qwen3_moe aux+z", "qwen3_moe", dp=1, ep=1, moe_aux_loss_coeff=AUX, moe_z_loss_coeff=Z,
            ref_path=models["qwen3_moe"]["ref_path"] + ".aux_dp1"),
    ])
    assert_parity(models, results)
    assert "lb_loss" in results[2] and "z_loss" in results[2] and "lb_loss" not in results[0]
    assert_aux_changes_gradients(models, "aux_dp1")


def assert_aux_changes_gradients(models, name: str) -> None:
    """The load-balancing term moves the reference gradient by far more than the tolerance (so
    the aux jobs' gradient parity can only hold if the engine adds it)."""
    import torch

    plain = torch.load(models["qwen3_moe"]["ref_path"], weights_only=False)["grads"]
    aux = torch.load(models["qwen3_moe"]["ref_path"] + "." + name, weights_only=False)["grads"]
    moved = max(float((aux[k] - v).abs().max()) for k, v in plain.items())
    print(f"max |grad(pg + router losses) - grad(pg)| = {moved:.2e}")
    assert moved > 100 * TOL


def test_moe_ep2(models):
    root = models["root"]
    if not (root / "qwen3_moe_w1.grads").exists():
        test_moe_one_rank(models)
    results = launch(models, 2, [
        job("(2,1,1,ep2) qwen3_moe", "qwen3_moe", dp=2, ep=2, ref_grads_path=str(root / "qwen3_moe_w1.grads")),
        job("(2,1,1,ep2) mixtral", "mixtral", dp=2, ep=2, ref_grads_path=str(root / "mixtral_w1.grads")),
        job("(2,1,1,ep2) qwen3_moe aux", "qwen3_moe", dp=2, ep=2, moe_aux_loss_coeff=AUX,
            ref_path=models["qwen3_moe"]["ref_path"] + ".aux_dp2"),
    ])
    assert_parity(models, results)
    assert all("grad_vs_world1" in r for r in results[:2]) and "lb_loss" in results[2]
    assert_aux_changes_gradients(models, "aux_dp2")


def test_moe_ep2_tp2_and_ep2_pp2(models):
    root = models["root"]
    if not (root / "qwen3_moe_w1.grads").exists():
        test_moe_one_rank(models)
    grads = str(root / "qwen3_moe_w1.grads")
    results = launch(models, 4, [
        job("(2,2,1,ep2,etp2) qwen3_moe", "qwen3_moe", dp=2, tp=2, ep=2, ref_grads_path=grads,
            export_dir=str(root / "export_ep2_tp2")),
        job("(2,1,2,ep2) qwen3_moe", "qwen3_moe", dp=2, pp=2, ep=2, ref_grads_path=grads),
    ])
    assert_parity(models, results)
    assert all("grad_vs_world1" in r for r in results)
    # save_hf after the step wrote the checkpoint layout (per-expert names) whose transformers
    # model gives the trained engine's log-probs
    print(f"exported (2,2,1,ep2,etp2): max |logp(export) - logp(engine)| = {results[0]['export']:.2e}")
    assert results[0]["export"] <= TOL
    from safetensors import safe_open

    with safe_open(str(root / "export_ep2_tp2" / "model.safetensors"), "pt") as f:
        assert "model.layers.1.mlp.experts.3.down_proj.weight" in set(f.keys())

"""Mixture-of-experts routing (flowrl.models.moe_routing): the hf backend records each token's
experts, the dp trainer replays them (R3) in every layout, the router statistics and losses."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from flowrl.data import experience as ex
from flowrl.data.packed import PackedBatch
from flowrl.models import moe_routing as mr

LAYOUTS = [(0, False), (48, False), (0, True), (48, True)]  # (token budget, shared prompts)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model, tiny_preset

    path = tmp_path_factory.mktemp("tiny_moe")
    tok = build_char_tokenizer()
    build_tiny_model(tok, **tiny_preset("moe")).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def rollout(moe_dir):
    """Three prompts x 3 samples from the hf backend, as the rollout role's table."""
    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.interfaces import SamplingParams
    from flowrl.models.char_tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    prompts = [tok.encode(s) for s in ("12+34=", "5+6=", "71+8=")]
    gen = HFGenerator(moe_dir)
    responses, logprobs = gen.generate(prompts, SamplingParams(n=3, max_new_tokens=5), seed=3)
    rng = np.random.default_rng(0)
    table = pa.table({
        "prompt_ids": ex.from_lists([p for p in prompts for _ in range(3)], ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "response_mask": ex.from_lists([[1] * len(r) for r in responses], pa.list_(pa.int8())),
        "rollout_logprobs": ex.from_lists(logprobs, ex.TOKEN_FLOATS),
        "advantages": ex.from_lists([rng.normal(size=len(r)).astype(np.float32) for r in responses], ex.TOKEN_FLOATS),
        mr.ROUTES_COLUMN: ex.from_lists(gen.last_routed_experts, pa.list_(pa.int16())),
    })
    return gen, table


def _engine(moe_dir, **kw):
    from flowrl.backends.train.dp_policy import TorchDPEngine

    return TorchDPEngine(moe_dir, **kw)


def test_generation_records_each_tokens_experts(rollout):
    """Every position generation computed holds the experts a teacher-forced forward of the whole
    sequence picks (fp32: the same routing); the last response token (never fed) holds -1."""
    gen, table = rollout
    routers = mr.moe_routers(gen.model)
    assert len(routers) == 2 and routers[0].top_k == 2
    for row in table.to_pylist():
        seq = row["prompt_ids"] + row["response_ids"]
        record = np.asarray(row[mr.ROUTES_COLUMN]).reshape(len(seq), 2, 2)
        with mr.RouteRecorder(gen.model) as rec:
            gen.model(input_ids=torch.tensor([seq]))
        forced = rec.take().numpy()
        assert (record[-1] == mr.NO_ROUTE).all()
        np.testing.assert_array_equal(np.sort(record[:-1], -1), np.sort(forced[:-1], -1))


@pytest.mark.parametrize("budget,shared", LAYOUTS)
def test_position_map_places_every_position(rollout, budget, shared):
    """Gathering the batch's tokens (prompt then response, row by row) through the map gives the
    layout's input ids: the map says where each recorded position sits."""
    _, table = rollout
    batch = PackedBatch.from_table(table).with_token_budget(budget).with_shared_prompts(shared)
    padded = batch.model_inputs(pad_id=0, pair_cost=0.0)
    map_BL = mr.position_map(batch, 0.0)
    tokens_X = torch.cat([torch.cat([torch.tensor(p), torch.tensor(r)])
                          for p, r in zip(table.column("prompt_ids").to_pylist(), table.column("response_ids").to_pylist())])
    real = map_BL >= 0
    assert torch.equal(tokens_X[map_BL[real]], padded.input_ids_BL[real].long())
    assert int(real.sum()) == (batch.num_tokens if not shared else int(real.sum()))
    if shared:  # each group's prompt computed once
        assert int(real.sum()) < batch.num_tokens


@pytest.mark.parametrize("budget,shared", LAYOUTS)
def test_replay_selects_recorded_experts_after_router_changed(moe_dir, rollout, budget, shared):
    """A trainer whose routers changed since generation (new random router weights): without replay
    it routes elsewhere; with it every recorded position uses the recorded experts."""
    _, table = rollout
    engine = _engine(moe_dir, trainable=False)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for router in mr.moe_routers(engine.model):
            router.weight.copy_(torch.randn(router.weight.shape, generator=gen))
    plain = PackedBatch.from_table(table).with_token_budget(budget).with_shared_prompts(shared)
    routed = mr.with_routes(PackedBatch.from_table(table), table).with_token_budget(budget).with_shared_prompts(shared)
    agree = total = 0
    for mb in routed.micro_batches(4):
        engine.forward_logprobs(mb, micro_batch_size=100)
        map_N = mr.position_map(mb, engine.pair_cost).reshape(-1)
        record_NRk = mb.routes_XW.reshape(-1, 2, 2)[map_N.clamp(min=0)]
        known_NR = (record_NRk >= 0).all(-1) & (map_N >= 0)[:, None]
        for layer, used_Nk in enumerate(engine.moe_tap.indices):
            rec = record_NRk[:, layer].long()[known_NR[:, layer]]
            agree += int((used_Nk[known_NR[:, layer]] == rec).all(-1).sum())
            total += rec.shape[0]
    assert total > 0 and agree == total
    logp_plain, _ = engine.forward_logprobs(plain, micro_batch_size=4)
    logp_routed, _ = engine.forward_logprobs(routed, micro_batch_size=4)
    assert not torch.allclose(logp_plain, logp_routed)
    # without replay the changed routers pick other experts somewhere (the injection took)
    engine.forward_logprobs(PackedBatch.from_table(table), micro_batch_size=100)
    own = engine.moe_tap
    batch = mr.with_routes(PackedBatch.from_table(table), table)
    map_N = mr.position_map(batch, 0.0).reshape(-1)
    record = batch.routes_XW.reshape(-1, 2, 2)[map_N.clamp(min=0)].long()
    known = (record[:, 0] >= 0).all(-1) & (map_N >= 0)
    differs = (own.indices[0][known].sort(-1).values != record[known, 0].sort(-1).values).any(-1)
    assert int(differs.sum()) > 0


@pytest.mark.parametrize("budget,shared", LAYOUTS)
def test_replay_on_unchanged_weights_gives_rollout_logprobs(moe_dir, rollout, budget, shared):
    """With the generation weights, replay changes nothing: the rollout's log-probs within 1e-5 in
    every layout (the weights of the recorded experts are the router's own probabilities)."""
    _, table = rollout
    engine = _engine(moe_dir, trainable=False)
    batch = mr.with_routes(PackedBatch.from_table(table), table).with_token_budget(budget).with_shared_prompts(shared)
    logp, _ = engine.forward_logprobs(batch, micro_batch_size=4)
    rollout_logp, _ = ex.token_column(table, "rollout_logprobs")
    assert float((logp - rollout_logp).abs().max()) < 1e-5


def test_one_step_with_replay_trains_the_router(moe_dir, rollout):
    """PolicyRole with actor.router_replay=true: one update gives a finite loss, MoE stats, and a
    gradient on both routers (the replayed weights are the router's probabilities)."""
    from flowrl.config import ActorConfig, OptimConfig
    from flowrl.roles.policy import PolicyRole

    _, table = rollout
    actor = ActorConfig(strategy="dp", data_parallel_size=1, optim=OptimConfig(lr=1e-3), use_kl_loss=False,
                        ppo_micro_batch_size_per_gpu=4, router_replay=True)
    role = PolicyRole(rank=0, world_size=1, model_dir=moe_dir, actor=actor, use_old_logprobs=False, response_length=5)
    metrics = role.update(table, mini_batch_rows=table.num_rows)
    assert np.isfinite(metrics["actor/pg_loss"]) and np.isfinite(metrics["actor/grad_norm"])
    assert 0.5 < metrics["actor/moe/replayed_fraction"] < 1.0  # the last token of each response has no record
    assert metrics["actor/moe/expert_load_max_over_mean"] >= 1.0
    grads = role.engine.grad_state_dict()
    for layer in range(2):
        g = grads[f"model.layers.{layer}.mlp.gate.weight"]
        assert torch.isfinite(g).all() and float(g.abs().sum()) > 0


def test_replay_refuses_a_table_without_routes(moe_dir, rollout):
    _, table = rollout
    with pytest.raises(ValueError, match="routed_experts.*rollout.name=hf"):
        mr.with_routes(PackedBatch.from_table(table), table.drop_columns([mr.ROUTES_COLUMN]))


def test_router_losses_are_transformers_and_join_the_loss(moe_dir, rollout):
    """The load-balancing loss equals transformers' aux_loss of the same padded batch; with
    coefficients (1, 0.1) and a zero policy loss, the step's gradient is that of
    ``lb + 0.1 * z`` (z = mean over layers of mean logsumexp(logits)^2 over real tokens)."""
    _, table = rollout
    batch = PackedBatch.from_table(table)
    engine = _engine(moe_dir, lr=1e-3)
    engine.moe_losses = mr.MoeLossSettings(aux_loss_coeff=1.0, z_loss_coeff=0.1)
    reference = _engine(moe_dir, trainable=True)
    padded = batch.padded(0)
    out = reference.model(input_ids=padded.input_ids_BL, attention_mask=padded.attention_mask_BL,
                          output_router_logits=True)
    mask_N = padded.attention_mask_BL.reshape(-1).bool()
    z = torch.stack([torch.logsumexp(lg[mask_N], -1).square().mean() for lg in out.router_logits]).mean()
    (out.aux_loss + 0.1 * z).backward()
    expected = {n: p.grad for n, p in reference.model.named_parameters() if "mlp.gate" in n}

    metrics = engine.train_step(batch, micro_batch_size=100,
                                loss_fn=lambda logp, ent, mb: (logp.sum() * 0.0, {}), with_entropy=False)
    assert metrics["moe/load_balancing_loss"] == pytest.approx(float(out.aux_loss.detach()), rel=1e-5)
    assert metrics["moe/z_loss"] == pytest.approx(float(z), rel=1e-5)
    got = engine.grad_state_dict()
    for name, g in expected.items():
        assert float((got[name] - g).abs().max()) < 1e-6, name


def test_dense_models_have_no_routes(tiny_model_dir):
    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.interfaces import SamplingParams

    gen = HFGenerator(str(tiny_model_dir))
    gen.generate([[5, 6, 7]], SamplingParams(n=2, max_new_tokens=3))
    assert gen.last_routed_experts is None and not mr.is_moe(gen.model)


def test_mixtral_routes_are_recorded_and_replayed(tmp_path):
    """The Mixtral-style router (always renormalised, no norm_topk_prob): generation's record is
    the teacher-forced routing, and replay at the generation weights gives its log-probs."""
    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.interfaces import SamplingParams
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model

    tok = build_char_tokenizer()
    build_tiny_model(tok, arch="mixtral", hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=32,
                     num_experts=4, num_experts_per_tok=2).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    gen = HFGenerator(str(tmp_path))
    prompts = [tok.encode("12+34="), tok.encode("5+6=")]
    responses, logprobs = gen.generate(prompts, SamplingParams(n=2, max_new_tokens=4), seed=0)
    table = pa.table({
        "prompt_ids": ex.from_lists([p for p in prompts for _ in range(2)], ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "rollout_logprobs": ex.from_lists(logprobs, ex.TOKEN_FLOATS),
        mr.ROUTES_COLUMN: ex.from_lists(gen.last_routed_experts, pa.list_(pa.int16())),
    })
    engine = _engine(str(tmp_path), trainable=False)
    logp, _ = engine.forward_logprobs(mr.with_routes(PackedBatch.from_table(table), table), micro_batch_size=4)
    rollout_logp, _ = ex.token_column(table, "rollout_logprobs")
    assert float((logp - rollout_logp).abs().max()) < 1e-5
    assert float(mr.moe_stats(engine.moe_tap)[mr.REPLAYED_FRACTION]) > 0.5

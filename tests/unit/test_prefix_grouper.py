"""Shared prompts (``actor.use_prefix_grouper``): each GRPO group's prompt computed once, its rows'
responses after it under a block attention mask. The layout by hand, then the same log-probs,
entropies, values and gradients as the per-row layouts (tiny Qwen2, fp32, single process, dp),
with and without a token budget, and the positions saved."""

import dataclasses

import pyarrow as pa
import pytest
import torch

from flowrl.backends.train.dp_policy import TorchDPEngine
from flowrl.backends.train.dp_value import TorchDPValueEngine
from flowrl.config import ActorConfig, CriticConfig, OptimConfig
from flowrl.config.errors import ConfigError
from flowrl.data import experience as ex
from flowrl.data.packed import PackedBatch
from flowrl.data import token_layout
from flowrl.data.token_layout import shared_prompt_lines, shared_prompt_segments
from flowrl.roles.policy import PolicyRole


def test_segments_are_runs_of_equal_prompts():
    # prompts [1 2] [1 2] [1 3] [4] [4] [] []: the third differs in one token, empty prompts stand alone
    prompt = torch.tensor([1, 2, 1, 2, 1, 3, 4, 4])
    cu = torch.tensor([0, 2, 4, 6, 7, 8, 8, 8])
    assert shared_prompt_segments(prompt, cu).tolist() == [0, 0, 1, 2, 2, 3, 4]
    # at most 6 tokens a segment: [1 2] + 3 + 2 = 7 > 6 splits the first group; [4] + 5 alone, then 1 + 1
    response_len = torch.tensor([3, 2, 1, 5, 1, 1, 1])
    assert shared_prompt_segments(prompt, cu, response_len, 6).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert shared_prompt_segments(prompt, cu, torch.tensor([1, 2, 1, 5, 1, 1, 1]), 6).tolist() == [0, 0, 1, 2, 3, 4, 5]


def test_layout_by_hand():
    # rows: prompt [1 2] response [10 11]; prompt [1 2] response [12]; prompt [3] response [13 14 15]
    prompt, prompt_cu = torch.tensor([1, 2, 1, 2, 3]), torch.tensor([0, 2, 4, 5])
    response, response_cu = torch.tensor([10, 11, 12, 13, 14, 15]), torch.tensor([0, 2, 3, 6])
    ids, positions, mask, row_T, pos_T, pred_T = shared_prompt_lines(prompt, prompt_cu, response, response_cu, 0)
    # segments of 2 + 2 + 1 = 5 and 1 + 3 = 4 tokens: two lines of 5 (10 positions) beat one of 10
    # (10, charged 2% for the longer attention)
    assert ids.tolist() == [[1, 2, 10, 11, 12], [3, 13, 14, 15, 0]]
    # responses continue from their prompt's length: [10 11] at 2, 3 and [12] at 2 again
    assert positions.tolist() == [[0, 1, 2, 3, 2], [0, 1, 2, 3, 0]]
    assert row_T.tolist() == [0, 0, 0, 1, 1, 1] and pos_T.tolist() == [2, 3, 4, 1, 2, 3]
    # 10 and 12 are predicted by the prompt's last token (column 1), 11 by 10; 13 by 3, then 13, 14
    assert pred_T.tolist() == [1, 2, 1, 0, 1, 2]
    assert mask[0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],  # 12 sees the prompt and itself, not the other response
    ]
    assert mask[1, 4].int().tolist() == [0, 0, 0, 0, 1]  # padding sees only itself (no empty softmax row)


def _table(group_sizes=(3, 1, 4, 2, 5), seed: int = 0) -> pa.Table:
    """GRPO-like rows: each group one prompt (lengths differ across groups; groups 1 and 3 have
    prompts of the same length), responses of 1-8 tokens; a group of size 1."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = [5, 3, 7, 3, 4]
    prompts, responses = [], []
    for size, plen in zip(group_sizes, prompt_lens):
        prompt = torch.randint(3, 40, (plen,), generator=g).tolist()
        for _ in range(size):
            prompts.append(prompt)
            responses.append(torch.randint(3, 40, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist())
    lengths = [len(r) for r in responses]
    adv = [[float(a)] * n for a, n in zip(torch.randn(len(lengths), generator=g), lengths)]
    old = [[-3.0 + 0.1 * i for i in range(n)] for n in lengths]
    mask = [[1] * (n - 1) + [int(i % 3 != 0)] for i, n in enumerate(lengths)]
    return pa.table({
        "prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
        "response_ids": ex.from_lists(responses, ex.TOKEN_IDS),
        "response_mask": ex.from_lists(mask, pa.list_(pa.int8())),
        "advantages": ex.from_lists(adv, ex.TOKEN_FLOATS),
        "old_logprobs": ex.from_lists(old, ex.TOKEN_FLOATS),
        "returns": ex.from_lists(adv, ex.TOKEN_FLOATS),
    })


@pytest.mark.parametrize("budget,attn,split", [(0, "sdpa", False), (60, "sdpa", False), (0, "eager", False),
                                                (60, "sdpa", True), (0, "eager", True)])
def test_logprobs_and_entropies_equal_the_per_row_layout(tiny_model_dir, monkeypatch, budget, attn, split):
    # PAIR_COST_PER_HIDDEN 0: whole groups; 8 (attention priced far above the linear layers): long groups split
    monkeypatch.setattr(token_layout, "PAIR_COST_PER_HIDDEN", 8.0 if split else 0.0)
    engine = TorchDPEngine(str(tiny_model_dir), trainable=False)
    engine.model.config._attn_implementation = attn
    batch = PackedBatch.from_table(_table()).with_token_budget(budget)
    # micro-batches of 4 rows (or 60 tokens) cut groups: a segment never spans two micro-batches
    logp, ent = engine.forward_logprobs(batch, micro_batch_size=4, with_entropy=True)
    slots = engine.slots_computed
    logp_s, ent_s = engine.forward_logprobs(batch.with_shared_prompts(), micro_batch_size=4, with_entropy=True)
    torch.testing.assert_close(logp_s, logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_s, ent, atol=1e-5, rtol=0)
    shared_slots = engine.slots_computed - slots
    assert shared_slots < slots or (split and shared_slots == slots)


def test_values_equal_the_per_row_layout(tiny_model_dir):
    engine = TorchDPValueEngine(str(tiny_model_dir), trainable=False)
    batch = PackedBatch.from_table(_table())
    values = engine.forward_values(batch, micro_batch_size=5)
    torch.testing.assert_close(engine.forward_values(batch.with_shared_prompts(), micro_batch_size=5), values,
                               atol=1e-5, rtol=0)


def _role(model_dir, *, shared: bool, dynamic: bool) -> PolicyRole:
    actor = ActorConfig(data_parallel_size=1, optim=OptimConfig(lr=1e-3), use_kl_loss=False,
                        loss_agg_mode="seq-mean-token-mean", ppo_micro_batch_size_per_gpu=4, use_dynamic_bsz=dynamic,
                        ppo_max_token_len_per_gpu=60, log_prob_use_dynamic_bsz=dynamic,
                        log_prob_max_token_len_per_gpu=50, entropy_coeff=0.01, use_prefix_grouper=shared)
    return PolicyRole(rank=0, world_size=1, model_dir=str(model_dir), actor=actor, response_length=8)


@pytest.mark.parametrize("dynamic", [False, True])
def test_update_gradients_equal_the_per_row_layout(tiny_model_dir, dynamic):
    table = _table()
    rows, shared = _role(tiny_model_dir, shared=False, dynamic=dynamic), _role(tiny_model_dir, shared=True, dynamic=dynamic)
    logp_rows, _ = ex.token_column(rows.compute_logprobs(table), "old_logprobs")
    logp_shared, _ = ex.token_column(shared.compute_logprobs(table), "old_logprobs")
    torch.testing.assert_close(logp_shared, logp_rows, atol=1e-5, rtol=0)
    m_rows, m_shared = rows.update(table, mini_batch_rows=15), shared.update(table, mini_batch_rows=15)
    assert m_shared["actor/grad_norm"] == pytest.approx(m_rows["actor/grad_norm"], rel=1e-5)
    assert m_shared["actor/pg_loss"] == pytest.approx(m_rows["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert m_shared["perf/train_padding_ratio"] < m_rows["perf/train_padding_ratio"]
    g_rows, g_shared = rows.grad_state_dict(), shared.grad_state_dict()
    assert set(g_shared) == set(g_rows)
    for name, g in g_rows.items():
        torch.testing.assert_close(g_shared[name], g, atol=1e-7, rtol=1e-5)


def test_critic_update_equals_the_per_row_layout(tiny_model_dir):
    from flowrl.roles.critic import CriticRole

    table = _table()
    table = table.append_column("values", table["old_logprobs"])
    grads = []
    for shared in (False, True):
        cfg = CriticConfig(data_parallel_size=1, optim=OptimConfig(lr=1e-3), ppo_micro_batch_size_per_gpu=4,
                           use_prefix_grouper=shared)
        role = CriticRole(rank=0, world_size=1, model_dir=str(tiny_model_dir), critic=cfg, response_length=8)
        role.update(table, mini_batch_rows=15)
        grads.append({n: p.grad.clone() for n, p in role.engine.model.named_parameters() if p.grad is not None})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-7, rtol=1e-5)


def test_slots_of_four_groups_of_sixteen():
    # 4 prompts of 6 tokens x 16 responses of 1..8 tokens (each length twice): 6 + 2 * 36 = 78
    # tokens per segment, 4 lines of 78 = 312 positions, every one a real token (no padding).
    # Per row: 64 rows x (6 + 8) = 896 padded, and 64 x 6 + 4 x 72 = 672 real tokens packed.
    prompts = [[3 + g] * 6 for g in range(4) for _ in range(16)]
    responses = [[5] * (1 + i % 8) for _ in range(4) for i in range(16)]
    batch = PackedBatch.from_table(pa.table({"prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
                                             "response_ids": ex.from_lists(responses, ex.TOKEN_IDS)}))
    assert batch.padded(0).num_slots == 896
    assert batch.num_tokens == 672
    assert batch.with_token_budget(16384).model_inputs(0).num_slots >= 672
    for budget in (0, 16384):  # with attention priced as for the 10M benchmark model (hidden 512) or free
        for pair_cost in (1 / 2048, 0.0):
            shared = batch.with_token_budget(budget).with_shared_prompts().model_inputs(0, pair_cost)
            assert shared.num_slots == 312 and tuple(shared.input_ids_BL.shape) == (4, 78)


def test_long_responses_after_a_short_prompt_are_not_grouped():
    # 4 prompts of 6 tokens x 16 responses of 128: one segment of 6 + 16 x 128 = 2054 tokens per
    # group costs 4 x 2054 x (1 + 2054 / 2048) = 16456 (positions plus attention pairs / 2048);
    # each row alone 64 x 134 x (1 + 134 / 2048) = 9137; two rows a segment 32 x 262 x (1 + 262 /
    # 2048) = 9457; four 16 x 518 x 1.253 = 10385; eight 8 x 1030 x 1.503 = 12386: rows alone.
    prompts = [[3 + g] * 6 for g in range(4) for _ in range(16)]
    long = PackedBatch.from_table(pa.table({"prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
                                            "response_ids": ex.from_lists([[5] * 128] * 64, ex.TOKEN_IDS)}))
    assert tuple(long.with_shared_prompts().model_inputs(0, 1 / 2048).input_ids_BL.shape) == (64, 134)
    assert tuple(long.with_shared_prompts().model_inputs(0, 0.0).input_ids_BL.shape) == (4, 2054)
    # 128-token prompts at 1 / 8192 (a hidden size of 2048): rows alone 64 x 256 x (1 + 256 / 8192)
    # = 16896; two a segment 32 x 384 x 1.047 = 12864; four 16 x 640 x 1.078 = 11040; eight
    # 8 x 1152 x 1.141 = 10512 (the cheapest); the whole group 4 x 2176 x 1.266 = 11016.
    prompts = [[3 + g] * 128 for g in range(4) for _ in range(16)]
    wide = PackedBatch.from_table(pa.table({"prompt_ids": ex.from_lists(prompts, ex.TOKEN_IDS),
                                            "response_ids": ex.from_lists([[5] * 128] * 64, ex.TOKEN_IDS)}))
    assert tuple(wide.with_shared_prompts().model_inputs(0, 1 / 8192).input_ids_BL.shape) == (8, 1152)


def test_prefix_grouper_is_refused_with_megatron():
    with pytest.raises(ConfigError, match="use_prefix_grouper.*megatron.*fix: set actor.use_prefix_grouper=auto or false"):
        ActorConfig(strategy="megatron", use_prefix_grouper=True, data_parallel_size=1)
    with pytest.raises(ConfigError, match="use_prefix_grouper.*critic.use_prefix_grouper=auto or false"):
        CriticConfig(strategy="megatron", use_prefix_grouper=True, data_parallel_size=1)
    assert dataclasses.replace(ActorConfig(), use_prefix_grouper=True).use_prefix_grouper


def test_verl_key_maps_to_the_actor_and_reaches_the_roles():
    from flowrl.config import load_config
    from flowrl.roles.specs import ref_spec

    cfg = load_config(None, ["actor_rollout_ref.actor.use_prefix_grouper=true", "actor_rollout_ref.ref.use_prefix_grouper=true"])
    assert cfg.actor.use_prefix_grouper and cfg.ref.use_prefix_grouper
    assert ref_spec(cfg).role_kwargs["prefix_grouper"] is True
    with pytest.raises(ConfigError, match="ref.use_prefix_grouper=True: the reference runs on actor.strategy=megatron"):
        load_config(None, ["actor.strategy=megatron", "ref.use_prefix_grouper=true"])


def test_block_mask_per_attention_implementation():
    from flowrl.backends.interfaces import block_attention_mask

    mask = torch.tensor([[[True, False], [True, True]]])
    assert block_attention_mask(mask, "sdpa").shape == (1, 1, 2, 2)  # bool, True: attend
    additive = block_attention_mask(mask, "eager")  # 0 where attended, the float32 minimum elsewhere
    assert additive[0, 0, 1].tolist() == [0.0, 0.0] and additive[0, 0, 0, 1] == torch.finfo(torch.float32).min
    with pytest.raises(ValueError, match="attn_implementation sdpa or eager.*'flash_attention_2'.*fix"):
        block_attention_mask(mask, "flash_attention_2")

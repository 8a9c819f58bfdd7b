"""Ulysses sequence parallelism's pure parts: the split arithmetic (``flowrl.data.sequence_split``),
the key/value head repeats, the config checks and verl's keys (issue 31 item 2, issue 37)."""

import pytest
import torch

from flowrl.config import ConfigError, load_config
from flowrl.data.packed import PackedBatch, Padded
from flowrl.data.sequence_split import concat_batches, full_mask, local_inputs, split_length


def _batch(prompts, responses, budget=0):
    def flat(rows):
        cu = torch.zeros(len(rows) + 1, dtype=torch.int64)
        cu[1:] = torch.cumsum(torch.tensor([len(r) for r in rows]), 0)
        return torch.tensor([t for r in rows for t in r], dtype=torch.int32), cu

    (p, pc), (r, rc) = flat(prompts), flat(responses)
    return PackedBatch(p, pc, r, rc, {"x": r.float()}, budget)


def test_split_length_pads_to_a_multiple_of_the_group():
    assert [split_length(n, 2) for n in (1, 2, 5, 6)] == [2, 2, 6, 6]
    assert split_length(7, 4) == 8 and split_length(7, 1) == 7
    with pytest.raises(ValueError):
        split_length(3, 0)


def test_padded_rows_mask_is_causal_over_real_tokens_and_extra_slots_see_themselves():
    # one row of 3 real tokens in a line of 4 (one right pad), padded to 6 for sp 3 (or 4 for sp 2)
    padded = Padded(torch.tensor([[5, 6, 7, 0]]), torch.tensor([[1, 1, 1, 0]]), torch.tensor([0]), torch.tensor([2]))
    mask = full_mask(padded, 6)[0].int()
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],  # the padding query sees the real keys before it (as transformers' sdpa mask)
        [0, 0, 0, 0, 1, 0],  # slots added for the split: themselves only
        [0, 0, 0, 0, 0, 1],
    ]


def test_packed_lines_mask_is_block_causal_where_positions_restart():
    # two sequences (positions 0 1 2 | 0 1) and a padding slot (position 0) in one line
    padded = Padded(torch.tensor([[5, 6, 7, 8, 9, 0]]), None, torch.tensor([0]), torch.tensor([4]),
                    torch.tensor([[0, 1, 2, 0, 1, 0]]))
    mask = full_mask(padded, 6)[0].int()
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]


def test_shared_prompt_block_mask_is_kept():
    batch = _batch([[5, 6], [5, 6]], [[7, 8], [9]]).with_shared_prompts()
    padded = batch.model_inputs(0)
    mask = full_mask(padded, split_length(padded.input_ids_BL.shape[1], 2))
    length = padded.input_ids_BL.shape[1]
    assert torch.equal(mask[:, :length, :length], padded.block_mask_BLL)


@pytest.mark.parametrize("budget", [0, 100])
def test_local_slices_cover_every_token_once_with_global_positions(budget):
    batch = _batch([[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14]], budget)
    padded = batch.model_inputs(0)
    sp = 3
    parts = [local_inputs(padded, 0, r, sp) for r in range(sp)]
    keep = torch.stack([p.keep_T for p in parts]).int()
    assert keep.sum(0).tolist() == [1] * batch.num_response_tokens  # each response token on exactly one rank
    width = split_length(padded.input_ids_BL.shape[1], sp) // sp
    full_pos = torch.zeros(padded.input_ids_BL.shape[0], width * sp, dtype=torch.long)
    full_pos[:, : padded.input_ids_BL.shape[1]] = (padded.position_ids_BL if padded.position_ids_BL is not None
                                                   else torch.arange(padded.input_ids_BL.shape[1]).expand_as(padded.input_ids_BL))
    for r, part in enumerate(parts):
        local = part.padded
        assert local.input_ids_BL.shape[1] == width and local.attention_mask_BL is None
        assert torch.equal(local.position_ids_BL, full_pos[:, r * width:(r + 1) * width])  # rotary: global positions
        # each kept token's predicting slot, located in the slice, holds the token before it
        ids = padded.input_ids_BL[padded.row_T[part.keep_T], padded.pred_T[part.keep_T]]
        assert torch.equal(local.input_ids_BL[local.row_T, local.pred_T], ids)
        # padded rows: plain causal attention (no mask built); packed lines: the whole lines' mask
        assert (part.mask_BLpLp is None) == (budget == 0)


def test_concat_batches_keeps_rows_and_token_fields_in_order():
    a, b = _batch([[5]], [[6, 7]]), _batch([[8, 9]], [[10]])
    both = concat_batches([a, b], 64)
    assert both.prompt_cu_B1.tolist() == [0, 1, 3] and both.response_cu_B1.tolist() == [0, 2, 3]
    assert both.response_T.tolist() == [6, 7, 10] and both.token_fields["x"].tolist() == [6.0, 7.0, 10.0]
    assert both.token_budget == 64


def test_kv_heads_fewer_than_the_group_are_repeated():
    from flowrl.backends.train.ulysses import kv_repeats

    assert kv_repeats(8, 4, 2) == 1  # 2 key/value heads a rank
    assert kv_repeats(8, 2, 4) == 2  # verl: repeated to sp heads, one a rank
    assert kv_repeats(12, 3, 2) == 4  # neither divides: every query head its own copy


def test_config_maps_and_refuses_sequence_parallel_sizes():
    cfg = load_config(None, ["actor.strategy=fsdp", "actor.ulysses_sequence_parallel_size=2",
                             "ref.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2"])
    assert (cfg.actor.ulysses_sequence_parallel_size, cfg.ref.ulysses_sequence_parallel_size,
            cfg.critic.ulysses_sequence_parallel_size) == (2, 2, 2)
    # the reference follows the actor unless set (verl's ${oc.select:...actor.ulysses_sequence_parallel_size,1})
    cfg = load_config(None, ["actor.strategy=fsdp", "actor.ulysses_sequence_parallel_size=2"])
    assert cfg.ref.ulysses_sequence_parallel_size is None and cfg.critic.ulysses_sequence_parallel_size == 1
    from flowrl.backends.train.ulysses_options import group_size
    assert group_size(cfg.ref, cfg.actor) == 2
    with pytest.raises(ConfigError, match="ref.ulysses_sequence_parallel_size=2: must divide ref.data_parallel_size=1"):
        load_config(None, ["actor.ulysses_sequence_parallel_size=2", "ref.data_parallel_size=1"])
    load_config(None, ["actor.ulysses_sequence_parallel_size=2", "ref.data_parallel_size=1",
                       "ref.ulysses_sequence_parallel_size=1"])
    with pytest.raises(ConfigError, match="actor.ulysses_sequence_parallel_size=3: must divide actor.data_parallel_size=2"):
        load_config(None, ["actor.ulysses_sequence_parallel_size=3"])
    with pytest.raises(ConfigError, match="Transformer Engine"):  # megatron: neither Ulysses nor context parallelism
        load_config(None, ["actor.strategy=megatron", "actor.ulysses_sequence_parallel_size=2"])
    with pytest.raises(ConfigError, match="ref.ulysses_sequence_parallel_size=2: Ulysses sequence parallelism runs in"):
        load_config(None, ["actor.strategy=megatron", "ref.ulysses_sequence_parallel_size=2"])
    with pytest.raises(ConfigError, match="critic.ulysses_sequence_parallel_size=0: must be an integer >= 1"):
        load_config(None, ["critic.ulysses_sequence_parallel_size=0"])


def test_engine_kwargs_only_when_split():
    from flowrl.backends.train.ulysses_options import sequence_parallel_kwargs
    from flowrl.config import ActorConfig

    assert sequence_parallel_kwargs(ActorConfig()) == {}
    assert sequence_parallel_kwargs(ActorConfig(ulysses_sequence_parallel_size=2)) == {"ulysses_sequence_parallel_size": 2}


def test_verl_command_line_maps_ulysses_keys():
    from flowrl.config.loader import load_config_with_notes
    from flowrl_testing.verl import RUN_QWEN2_7B

    AR = "actor_rollout_ref"
    args = [a for a in RUN_QWEN2_7B if "ppo_micro_batch_size_per_gpu" not in a] + [
        f"{AR}.actor.ulysses_sequence_parallel_size=2", f"{AR}.ref.ulysses_sequence_parallel_size=2",
        "critic.ulysses_sequence_parallel_size=2",
        f"{AR}.actor.ppo_micro_batch_size=16"]  # verl: 16 // (8 GPUs // sp 2) = 4 a GPU
    cfg, _, _ = load_config_with_notes(None, args)
    assert cfg.actor.strategy == "fsdp" and cfg.actor.data_parallel_size == 8
    assert load_config(None, [f"{AR}.actor.ulysses_sequence_parallel_size=2"]).ref.ulysses_sequence_parallel_size is None
    assert (cfg.actor.ulysses_sequence_parallel_size, cfg.ref.ulysses_sequence_parallel_size,
            cfg.critic.ulysses_sequence_parallel_size) == (2, 2, 2)
    assert cfg.actor.ppo_micro_batch_size_per_gpu == 4
    # the FSDP engine's copies (verl 0.9.1's fsdp_config.ulysses_sequence_parallel_size) map to the same keys
    cfg, _, _ = load_config_with_notes(None, RUN_QWEN2_7B + [f"{AR}.actor.fsdp_config.ulysses_sequence_parallel_size=4",
                                                            f"{AR}.ref.fsdp_config.ulysses_sequence_parallel_size=2"])
    assert (cfg.actor.ulysses_sequence_parallel_size, cfg.ref.ulysses_sequence_parallel_size) == (4, 2)
    # megatron's context parallelism is refused by name, pointing at Ulysses
    with pytest.raises(ConfigError, match="Transformer Engine.*ulysses_sequence_parallel_size"):
        load_config(None, [f"{AR}.actor.megatron.context_parallel_size=2"])

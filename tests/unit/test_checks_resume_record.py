"""The resume record's comparison (issue 32 item 5), pure: an equal record passes; each field a
restore can get wrong is named (the end-to-end faults: ``tests/dist/test_checks_resume.py``)."""

from __future__ import annotations

import copy

from flowrl.checks.resume import compare, record, stream_position


def _record(**over):
    per_rank = [{"params": {"w": [1.5, 3.0], "b": [0.25, 0.5]}, "optim_step": 4,
                 "optim_norms": {"exp_avg": 0.125, "exp_avg_sq": 1e-6}}, {"optim_norms": {}}]
    base = dict(layout="dp x2", next_step=4, batch="abc", seed=1,
                stream=stream_position({"weight_version": 4, "next": [4, 0], "queue": []}),
                family={"kl_ctrl": {"value": 0.1}})
    return record(per_rank, **{**base, **over})


def test_an_equal_record_passes_and_an_old_checkpoint_is_not_judged():
    assert compare(_record(), _record(), "ckpt").ok
    assert compare(None, _record(), "ckpt").ok is None


def test_each_field_a_restore_gets_wrong_is_named():
    saved = _record()
    live = copy.deepcopy(saved)
    live["params"]["w"][0] += 1e-6  # a parameter moved by 1e-6 (its scale 3.0): caught
    live["optim_norms"][0]["exp_avg_sq"] = 0.0  # a fresh optimizer state
    live["optim_step"] = 0
    verdict = compare(saved, live, "ckpt")
    assert verdict.ok is False and verdict.value == 3
    assert "parameters (1 of 2: w)" in verdict.message and "optimizer step 0 restored, 4 saved" in verdict.message
    assert "optimizer state exp_avg_sq on trainer rank 0: squared norm 0 restored, 1e-06 saved" in verdict.message
    moved = compare(saved, _record(next_step=3), "ckpt")
    assert "data position: the run continues at step 3, the checkpoint was saved to continue at step 4" in moved.message
    other = compare(saved, _record(batch="xyz", seed=2, family={"kl_ctrl": {"value": 0.2}},
                                   stream=stream_position({"weight_version": 3, "next": [4, 0], "queue": []})), "ckpt")
    assert other.value == 4 and "the prompts of step 4 differ" in other.message and "trainer.seed 2" in other.message
    # another layout: the optimizer's per-rank norms are not comparable, the rest is
    assert compare(saved, {**copy.deepcopy(saved), "layout": "fsdp x4", "optim_norms": [{}]}, "ckpt").ok


def test_the_stream_position_is_the_first_request_a_resume_generates():
    assert stream_position(None) is None
    assert stream_position({"weight_version": 2, "next": [3, 1], "queue": [[2, 3, 2], [3, 0, 2]]}) == \
        {"weight_version": 2, "first": [2, 3]}
    assert stream_position({"weight_version": 2, "next": [2, 0], "queue": []}) == {"weight_version": 2, "first": [2, 0]}


class _Engine:
    """An engine with both a full ``checkpoint_state`` and a gathered ``hf_state_dict``, recording
    which of them a rank called (an FSDP engine has both; its ``checkpoint_state`` is collective)."""

    def __init__(self, rank: int):
        import torch

        self.rank, self.calls = rank, []
        self.params = {"w": torch.arange(4, dtype=torch.float32)}

    def checkpoint_state(self):
        self.calls.append("checkpoint_state")
        return {"params": self.params, "optim": {"exp_avg": {"w": self.params["w"] * 0 + 1}}, "optim_step": 3}

    def hf_state_dict(self):
        self.calls.append("hf_state_dict")
        return self.params if self.rank == 0 else None


def test_sharded_engines_gather_on_every_rank_and_full_ones_on_rank_zero():
    from flowrl.checks.resume import engine_state

    sharded = [_Engine(r) for r in range(2)]
    outs = [engine_state(e, e.rank, sharded=True) for e in sharded]
    assert [e.calls for e in sharded] == [["hf_state_dict"], ["hf_state_dict"]]  # never rank 0 alone
    assert set(outs[0]["params"]) == {"w"} and "params" not in outs[1]
    full = [_Engine(r) for r in range(2)]
    outs = [engine_state(e, e.rank, sharded=False) for e in full]
    assert [e.calls for e in full] == [["checkpoint_state"], []]
    assert outs[0]["optim_step"] == 3 and outs[0]["optim_norms"] == {"exp_avg": 4.0}
    assert outs[1]["optim_step"] is None and "params" not in outs[1]


def test_the_ppo_critics_parameters_and_optimizer_are_recorded_and_compared():
    critic = [{"params": {"score.weight": [0.5, 1.0]}, "optim_step": 4, "optim_norms": {"exp_avg": 0.25}}]
    saved = _record(critic=critic, critic_layout="dp x1")
    assert saved["critic"]["params"] == {"score.weight": [0.5, 1.0]} and compare(saved, copy.deepcopy(saved), "c").ok
    live = copy.deepcopy(saved)
    live["critic"]["params"]["score.weight"][0] = 0.75  # a critic restored from other weights
    live["critic"]["optim_step"] = 0
    verdict = compare(saved, live, "ckpt")
    assert verdict.ok is False and verdict.value == 2
    assert "critic parameters (1 of 1: score.weight)" in verdict.message
    assert "critic optimizer step 0 restored, 4 saved" in verdict.message
    assert compare(_record(), _record(critic=critic), "old").ok  # a record saved before the critic's: not judged


def test_a_chained_optimizers_states_are_read_through_the_wrapper():
    """megatron-core's ChainedOptimizer promotes no ``state`` of its own (its property raises):
    the record reads each chained optimizer's, so a megatron checkpoint records its step."""
    import torch

    from flowrl.checks.resume import _local_optimizer_norms

    class Inner:  # a MegatronOptimizer: ``state`` promoted from its torch optimizer
        def __init__(self, value):
            self.state = {0: {"step": torch.tensor(3.0), "exp_avg": torch.full((2,), value)}}

    class Chained:
        def __init__(self, *parts):
            self.chained_optimizers = list(parts)

        @property
        def state(self):
            raise AttributeError("'ChainedOptimizer' object has no attribute 'optimizer'")

    norms, step = _local_optimizer_norms(Chained(Inner(1.0), Inner(2.0)))
    assert step == 3 and norms == {"exp_avg": 2 * 1.0 + 2 * 4.0}
    assert _local_optimizer_norms(Chained(Inner(1.0), object())) == ({}, None)


def test_the_layout_names_every_parallel_size_so_other_meshes_are_not_compared():
    from flowrl.checks.resume import layout_key
    from flowrl.config import load_config

    def key(*overrides):
        cfg = load_config(None, ["actor.strategy=megatron", *overrides])
        return layout_key(cfg.actor, 4)

    tp2pp2 = key("actor.tensor_model_parallel_size=2", "actor.pipeline_model_parallel_size=2", "actor.data_parallel_size=1")
    tp4 = key("actor.tensor_model_parallel_size=4", "actor.data_parallel_size=1")
    assert tp2pp2 != tp4 and "tensor_model_parallel_size=2" in tp2pp2 and tp2pp2.startswith("x4 strategy=megatron")
    assert key("actor.data_parallel_size=4") != key("actor.data_parallel_size=4", "actor.use_distributed_optimizer=true")

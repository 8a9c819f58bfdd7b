"""Reshard on a real cluster: megatron training shards -> full transformers models for generation.

The trainer (megatron, TP2xPP2 or TP2) loads model A; the generation engines load model B (same
shapes, another seed), so before a reshard their log-probs differ. After it, every generation
rank holds the trainer's weights bit for bit and its teacher-forced log-probs equal the trainer's
on the same rows within 1e-6 (fp32; measured 9.5e-7, two float32 ulps at |logp| ~ 4.6), both
colocated (trainer and generator in one process: ``HybridRole``, micro-DP placement, local slicing
plus point-to-point in the group) and split (a separate rollout group, over a joint gloo group
formed through ``nodes.reshard``), and the planned transport moves exactly the plan's minimum.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from flowrl.actors import Gather, GroupMesh, Session
from flowrl.backends.interfaces import SamplingParams
from flowrl.backends.reshard import make_job
from flowrl.config import ActorConfig
from flowrl.data import experience
from flowrl.parallel.mesh import ParallelDims

pytest.importorskip("megatron.core")

HYBRID = "flowrl_testing.hybrid:HybridRole"
ROLLOUT = "flowrl.roles.rollout:RolloutRole"
TOL = 1e-6
BUCKET = 4096  # bytes: many rounds even on the tiny model


def _model_dir(path, seed):
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, arch="llama", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                             intermediate_size=64, tie_word_embeddings=False, seed=seed)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard_models")
    return _model_dir(root / "train", 0), _model_dir(root / "gen", 1)


def _rows(vocab: int = 60) -> pa.Table:
    import random

    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randrange(3, 7))] for _ in range(6)]
    responses = [[rng.randrange(3, vocab) for _ in range(rng.randrange(1, 6))] for _ in range(6)]
    return pa.table({"prompt_ids": experience.from_lists(prompts, experience.TOKEN_IDS),
                     "response_ids": experience.from_lists(responses, experience.TOKEN_IDS)})


def _roles(train_dir, gen_dir, tp, pp):
    actor = ActorConfig(strategy="megatron", data_parallel_size=1, tensor_model_parallel_size=tp,
                        pipeline_model_parallel_size=pp, use_kl_loss=False)
    policy = {"model_dir": train_dir, "actor": actor, "use_old_logprobs": False,
              "engine_kwargs": {"tp": tp, "pp": pp, "dp": 1}}
    rollout = {"model_dir": gen_dir, "sampling": SamplingParams(n=1, max_new_tokens=4)}
    return policy, rollout


def _max_diff(a: pa.Table, b: pa.Table, col_a: str, col_b: str) -> float:
    xs, ys = a.column(col_a).to_pylist(), b.column(col_b).to_pylist()
    return max(abs(x - y) for rx, ry in zip(xs, ys, strict=True) for x, y in zip(rx, ry, strict=True))


def _trainer_logprobs(group, rows):
    out, _ = group.bind().run("compute_logprobs", rows, gather_mode=Gather.OUTPUT,
                              kwargs={"column": "old_logprobs"})
    return out


def _reshard_split(hybrid, rollout, job):
    from flowrl import nodes

    out = nodes.reshard(hybrid.bind(), rollout.bind(), None, job)
    return out.metrics


def _check_weights(trainer_state, gen_states):
    """Every generation rank holds exactly the trainer's weights (bit for bit)."""
    import torch

    for state in gen_states:
        assert set(state) == set(trainer_state)
        for name, value in trainer_state.items():
            assert torch.equal(state[name], value), name


def _check_metrics(metrics, job, *, bucket):
    plan = job.plan()
    assert metrics["reshard/bytes"] == metrics["reshard/bytes_min"] == plan.bytes_min > 0
    assert metrics["reshard/peak_extra_bytes"] <= bucket


def _run_layout(session, model_dirs, *, tp, pp, gen_dp_split):
    """One layout: colocated (hybrid group) and split (hybrid group -> rollout group)."""
    train_dir, gen_dir = model_dirs
    policy, rollout_kwargs = _roles(train_dir, gen_dir, tp, pp)
    world = tp * pp
    groups = session.create_groups([
        _spec("hybrid", HYBRID, {"policy": policy, "rollout": rollout_kwargs}, GroupMesh(tp=tp, pp=pp)),
        _spec("rollout", ROLLOUT, rollout_kwargs, GroupMesh(dp=gen_dp_split)),
    ])
    hybrid, rollout = groups["hybrid"], groups["rollout"]
    rows = _rows()
    want = _trainer_logprobs(hybrid, rows)
    trainer_state, _ = hybrid.bind().run("hf_state_dict", gather_mode=Gather.FIRST)
    src = ParallelDims(dp=1, tp=tp, pp=pp)

    # colocated: TPxPP -> TP1 x DP(world), each process generating with a full model
    before, _ = hybrid.bind().run("gen_logprobs", rows, gather_mode=Gather.ALL)
    assert all(_max_diff(want, b, "old_logprobs", "gen_logprobs") > 1e-3 for b in before)
    job = make_job(train_dir, src=src, dst=ParallelDims(dp=world, tp=1, pp=1), placement="colocated",
                   dst_style="hf", bucket_bytes=BUCKET)
    from flowrl_testing.nodes import reshard_local

    _check_metrics(reshard_local(hybrid.bind(), None, job).metrics, job, bucket=BUCKET)
    _check_weights(trainer_state, hybrid.bind().run("gen_state_dict", gather_mode=Gather.ALL)[0])
    after, _ = hybrid.bind().run("gen_logprobs", rows, gather_mode=Gather.ALL)
    diffs = [_max_diff(want, a, "old_logprobs", "gen_logprobs") for a in after]
    print(f"\ncolocated (tp={tp},pp={pp}) -> (dp={world}): max |logp diff| per rank {diffs}")
    assert max(diffs) <= TOL

    # split: the same shards to a separate rollout group over the joint group (formed here)
    job = make_job(train_dir, src=src, dst=ParallelDims(dp=gen_dp_split, tp=1, pp=1), placement="split",
                   dst_style="hf", bucket_bytes=BUCKET, joint=_joint(world + gen_dp_split))
    before, _ = rollout.bind().run("compute_logprobs", rows, gather_mode=Gather.ALL)
    assert all(_max_diff(want, b, "old_logprobs", "gen_logprobs") > 1e-3 for b in before)
    _check_metrics(_reshard_split(hybrid, rollout, job), job, bucket=BUCKET)
    _check_weights(trainer_state, rollout.bind().run("hf_state_dict", gather_mode=Gather.ALL)[0])
    after, _ = rollout.bind().run("compute_logprobs", rows, gather_mode=Gather.ALL)
    diffs = [_max_diff(want, a, "old_logprobs", "gen_logprobs") for a in after]
    print(f"split (tp={tp},pp={pp}) -> (dp={gen_dp_split}): max |logp diff| per rank {diffs}")
    assert max(diffs) <= TOL

    # the naive baseline lands on the same weights (after scrambling them back), moving more
    rollout.bind().run("load_hf_state", _gen_state(gen_dir))
    naive = make_job(train_dir, src=src, dst=ParallelDims(dp=gen_dp_split, tp=1, pp=1), placement="split",
                     dst_style="hf", transport="naive", joint=_joint(world + gen_dp_split))
    metrics = _reshard_split(hybrid, rollout, naive)
    assert metrics["reshard/bytes"] > metrics["reshard/bytes_min"]
    _check_weights(trainer_state, rollout.bind().run("hf_state_dict", gather_mode=Gather.ALL)[0])
    after, _ = rollout.bind().run("compute_logprobs", rows, gather_mode=Gather.ALL)
    assert max(_max_diff(want, a, "old_logprobs", "gen_logprobs") for a in after) <= TOL


def _gen_state(gen_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(gen_dir).state_dict()


def _joint(world_size):
    from flowrl.comm import JointSpec

    return JointSpec("actor+rollout", "", 0, world_size, 120.0)


def _spec(name, role, kwargs, mesh):
    from flowrl.actors.session import GroupSpec

    return GroupSpec(name, role, kwargs, mesh)


def test_tp2_pp2_to_tp1_dp4_colocated_and_split(model_dirs):
    with Session.start(8, timeout_s=120, startup_timeout_s=180) as session:
        _run_layout(session, model_dirs, tp=2, pp=2, gen_dp_split=4)


def test_tp2_to_tp1_colocated_and_split(model_dirs):
    with Session.start(3, timeout_s=120, startup_timeout_s=180) as session:
        _run_layout(session, model_dirs, tp=2, pp=1, gen_dp_split=1)

"""Asynchronous RL and the options around it, without a cluster: the generation built ahead of
its step (trainer.staleness), the rollout correction's node, the critic warmup's graph and the
config checks that refuse what cannot overlap."""

import pyarrow as pa
import pytest

from flowrl.actors import GroupMesh, WorkerGroup
from flowrl.config import ConfigError, load_config
from flowrl.graphs.family import BuildContext, Family, resolve_family
from flowrl.run.weight_sync import RolloutsAhead, lag_metrics

PROMPTS = pa.table({"group": pa.array([0], pa.int64())})


def _group(name, dp=1):
    return WorkerGroup(name, actors=[None] * dp, addresses=[""] * dp, mesh=GroupMesh(dp=dp))


def _ctx(cfg):
    groups = {"rollout": _group("rollout", 2), "actor": _group("actor", 2), "ref": _group("ref"),
              "critic": _group("critic")}
    return BuildContext(cfg, groups, "/x")


def _deps(*outputs):
    from dask.highlevelgraph import HighLevelGraph

    graph = HighLevelGraph.merge(*(o.__dask_graph__() for o in outputs))
    return {str(k).rsplit("-", 1)[0]: {str(d).rsplit("-", 1)[0] for d in deps}
            for k, deps in graph.get_all_dependencies().items()}


def test_generation_ahead_reserves_rollout_calls_before_the_steps_reshard():
    # staleness 1: gen(0), gen(1) are submitted before step 0's graph, whose reshard then comes
    # after gen(1) in the rollout's call order (gen(1) runs with the weights of step 0's start)
    cfg = load_config(None, ["trainer.staleness=1", "actor.use_kl_loss=false"])
    ctx = _ctx(cfg)
    family = resolve_family(cfg)(cfg)
    assert family.generates_ahead() and not Family.generates_ahead()
    ahead = [family.rollout(ctx, PROMPTS, step=j, weight_version=0) for j in (0, 1)]
    assert set(_deps(ahead[0])) == {"gen", "reward"}  # rollout calls only
    rollout_seq_before = ctx.groups["rollout"].reserve()  # 3: gen(0) had 1, gen(1) 2
    actor_seq_before = ctx.groups["actor"].reserve()
    graph = family.build(ctx, PROMPTS, step=0, collected=ahead[0])
    assert ctx.groups["rollout"].reserve() == rollout_seq_before + 2  # the reshard took the one after
    assert ctx.groups["actor"].reserve() == actor_seq_before + 3  # update_actor, reshard
    deps = _deps(*graph.outputs)
    assert deps["update_actor"] == {"adv"} and "gen" in deps["reward"]


def test_rollout_correction_node_sits_between_advantages_and_the_update():
    cfg = load_config(None, ["algorithm.rollout_is_threshold=2.0", "algorithm.rollout_is=true", "actor.use_kl_loss=false"])
    assert cfg.needs_old_logprobs  # pi_old of the weights
    deps = _deps(*resolve_family(cfg)(cfg).build(_ctx(cfg), PROMPTS, step=0).outputs)
    assert deps["rollout_corr"] == {"adv"} and deps["update_actor"] == {"rollout_corr"}
    assert "old_log_prob" in deps["adv"]
    off = load_config(None, ["actor.use_kl_loss=false"])
    assert "rollout_corr" not in _deps(*resolve_family(off)(off).build(_ctx(off), PROMPTS, step=0).outputs)


def test_critic_warmup_steps_update_the_critic_only():
    cfg = load_config(None, ["algorithm.adv_estimator=gae", "trainer.critic_warmup=2", "actor.use_kl_loss=false"])
    family = resolve_family(cfg)(cfg)
    warm = _deps(*family.build(_ctx(cfg), PROMPTS, step=1).outputs)
    assert "update_critic" in warm and "update_actor" not in warm and "reshard" not in warm
    assert warm["critic_warmup"] == {"update_critic"}
    after = _deps(*family.build(_ctx(cfg), PROMPTS, step=2).outputs)
    assert {"update_critic", "update_actor", "reshard"} <= set(after)


def test_rollouts_ahead_versions_and_lag_metrics():
    submitted = []
    ahead = RolloutsAhead(2)
    ahead.fill(5, 7, lambda j, v: submitted.append((j, v)) or f"f{j}")  # a pipeline (re)started at step 5
    ahead.take(5)
    ahead.fill(6, 8, lambda j, v: submitted.append((j, v)) or f"f{j}")
    assert submitted == [(5, 5), (6, 5), (7, 5), (8, 6)]  # max(start, j - N)
    assert ahead.in_flight() == [6, 7, 8]
    spans = {"gen": (10.0, 11.0), "update_actor": (12.0, 13.0), "old_log_prob": (11.5, 11.75)}
    prev = {"gen": (8.0, 9.5), "update_actor": (9.0, 11.0)}
    m = lag_metrics(8, [6, 6, 7], spans, prev)
    assert m["async/staleness_mean"] == pytest.approx(5 / 3) and m["async/staleness_max"] == 2
    assert m["async/rollout_idle_s"] == 0.5  # 10.0 - 9.5
    assert m["async/trainer_idle_s"] == 0.75  # 12.0 - 11.0 - 0.25 in old_log_prob


def test_config_refuses_what_cannot_run_asynchronously():
    with pytest.raises(ConfigError, match="free_cache_engine"):
        load_config(None, ["rollout.name=vllm", "rollout.free_cache_engine=true", "trainer.staleness=1"])
    with pytest.raises(ConfigError, match="filter_groups"):
        load_config(None, ["algorithm.filter_groups.enable=true", "trainer.staleness=1"])
    with pytest.raises(ConfigError, match="critic_warmup"):
        load_config(None, ["trainer.critic_warmup=2"])  # grpo starts no critic
    with pytest.raises(ConfigError, match="rollout_is"):
        load_config(None, ["algorithm.rollout_is=true"])  # no threshold
    with pytest.raises(ConfigError, match="staleness"):
        load_config(None, ["trainer.staleness=-1"])
    assert load_config(None, []).trainer.staleness == 0


def test_stream_requests_and_partial_pieces_have_their_own_keys_and_chain(tiny_model_dir):
    # stream mode: each request of a step is its own rollout graph (round: its seed and keys);
    # with partial rollouts a request is a chain of pieces, the last one scored
    from flowrl.graphs.stream_pieces import first_piece, next_piece

    cfg = load_config(None, ["trainer.async_mode=stream", "trainer.partial_rollout=true", "actor.use_kl_loss=false",
                             f"model.path={tiny_model_dir}"])
    ctx = _ctx(cfg)
    family = resolve_family(cfg)(cfg)
    assert set(_deps(family.rollout(ctx, PROMPTS, step=3, weight_version=2, round=1))) == {"gen_r1", "reward_r1"}
    before = ctx.groups["rollout"].reserve()
    p0 = first_piece(ctx, PROMPTS, step=3, round=2, weight_version=2)
    p1 = next_piece(ctx, p0, step=3, round=2, piece=1, weight_version=3, last=False)
    p2 = next_piece(ctx, p1, step=3, round=2, piece=2, weight_version=3, last=True)
    assert ctx.groups["rollout"].reserve() == before + 4  # one rollout call per piece, in order
    deps = _deps(p2)
    assert deps["reward_r2"] == {"gen_p2_r2"} and deps["gen_p2_r2"] == {"gen_p1_r2"} and deps["gen_p1_r2"] == {"gen_p0_r2"}

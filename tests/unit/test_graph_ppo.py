"""The iteration graphs beyond plain GRPO (the ppo and remax families, the shared options in a
grpo graph), without a cluster: which nodes each setting adds and what depends on what (the
critic and actor updates run in parallel)."""

import pyarrow as pa

from flowrl.actors import GroupMesh, WorkerGroup
from flowrl.config import load_config
from flowrl.graphs.family import BuildContext, resolve_family
from flowrl.graphs.grpo import GRPO
from flowrl.graphs.ppo import PPO


def _group(name, dp=1):
    return WorkerGroup(name, actors=[None] * dp, addresses=[""] * dp, mesh=GroupMesh(dp=dp))


def _groups():
    return {"rollout": _group("rollout", 2), "actor": _group("actor", 2), "ref": _group("ref"),
            "critic": _group("critic"), "rm": _group("rm")}


def build_iteration(cfg, groups, prompts, *, step, tokenizer_dir, kl_coef=None):
    family = resolve_family(cfg)(cfg)
    if kl_coef is not None:
        family.state.kl_ctrl.value = kl_coef
    return family.build(BuildContext(cfg, groups, tokenizer_dir), prompts, step=step)


def uses_ppo_graph(cfg):  # a family beyond GRPO's (critic or greedy baseline)
    return resolve_family(cfg) is not GRPO


def _deps(graph):
    def name(key):
        return key.rsplit("-", 1)[0]

    return {name(k): {name(d) for d in deps} for k, deps in graph.dependencies().items()}


PROMPTS = pa.table({"group": pa.array([0], pa.int64())})


def test_ppo_graph_with_critic():
    cfg = load_config(None, ["algorithm.adv_estimator=gae", "actor.ppo_mini_batch_size=16", "actor.use_kl_loss=false"])
    assert resolve_family(cfg) is PPO and cfg.needs_critic and not cfg.needs_reference
    groups = _groups()
    deps = _deps(build_iteration(cfg, groups, PROMPTS, step=1, tokenizer_dir="/x"))
    assert {"gen", "reward", "values", "old_log_prob", "adv", "update_critic", "update_actor", "reshard", "collect"} == set(deps)
    assert deps["values"] == {"reward"} and deps["old_log_prob"] == {"reward"}  # in parallel
    assert deps["adv"] == {"reward", "values", "old_log_prob"}
    assert deps["update_critic"] == {"adv"} and deps["update_actor"] == {"adv"}  # in parallel
    assert deps["collect"] == {"adv", "update_actor", "update_critic"}
    assert groups["critic"].reserve() == 3  # values (1), update (2)


def test_remax_adds_a_greedy_generation_and_kl_in_reward_precedes_the_advantages():
    cfg = load_config(None, ["algorithm.adv_estimator=remax", "algorithm.use_kl_in_reward=true", "actor.use_kl_loss=false"])
    assert cfg.needs_reference and cfg.needs_old_logprobs and not cfg.needs_critic
    deps = _deps(build_iteration(cfg, _groups(), PROMPTS, step=0, tokenizer_dir="/x", kl_coef=0.2))
    assert deps["gen_baseline"] == set()  # from the prompts, on the rollout group after gen
    assert deps["reward_baseline"] == {"reward", "gen_baseline"}
    assert deps["kl_in_reward"] == {"reward_baseline", "ref", "old_log_prob"}
    assert deps["adv"] == {"kl_in_reward"}
    assert "values" not in deps and "update_critic" not in deps


def test_reward_model_and_overlong_nodes():
    cfg = load_config(None, ["reward_model.enable=true", "reward_model.model_path=/rm", "actor.use_kl_loss=false",
                             "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=2"])
    deps = _deps(build_iteration(cfg, _groups(), PROMPTS, step=0, tokenizer_dir="/x"))
    assert deps["rm_score"] == {"gen"} and deps["reward"] == {"gen"}  # reward model and rules in parallel
    assert deps["combine_rewards"] == {"reward", "rm_score"}
    assert deps["overlong"] == {"combine_rewards"}
    assert deps["adv"] == {"overlong"}


def test_plain_grpo_keeps_the_lean_graph():
    assert not uses_ppo_graph(load_config(None, []))
    assert not uses_ppo_graph(load_config(None, ["algorithm.adv_estimator=rloo"]))

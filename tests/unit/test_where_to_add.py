"""ARCHITECTURE.md's "Where to add ..." list, performed: every bullet's addition is made from a
module outside the package (written into ``tmp_path``, put on ``sys.path``) and shown to take
effect: the config accepts it, the registry resolves it, and the code that a run calls computes
with it. The bullets are read from ARCHITECTURE.md, so a bullet without a case here fails."""

from __future__ import annotations

import asyncio
import re
import sys
import textwrap
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from flowrl.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def where_to_add_items() -> list[str]:
    """The things the section's bullets say how to add: ``- **a policy loss, a KL estimator**: ...``
    -> ``["policy loss", "kl estimator"]`` (articles and parentheses dropped, lower case)."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    assert "\n## Where to add" in text, "ARCHITECTURE.md lost its '## Where to add ...' section"
    section = text.split("\n## Where to add", 1)[1].split("\n## ", 1)[0]
    items = []
    for label in re.findall(r"^- \*\*(.+?)\*\*", section, re.M):
        for part in re.split(r",\s*|\s+and\s+|\s+or\s+", re.sub(r"\(.*?\)", "", label)):
            part = re.sub(r"^(an?|the)\s+", "", part.strip().lower())
            if part:
                items.append(part)
    return items


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """``outside(source) -> module name``: a module of the user's, outside flowrl, importable."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def write(source: str) -> str:
        name = f"my_addition_{uuid.uuid4().hex[:10]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        made.append(name)
        return name

    yield write
    for name in made:
        sys.modules.pop(name, None)


def _experience() -> pa.Table:
    """Two rows of one prompt group, two response tokens each; outcome rewards 1 and 0."""
    floats = pa.list_(pa.float32())
    return pa.table({
        "group": pa.array([0, 0], pa.int64()),
        "token_rewards": pa.array([[0.0, 1.0], [0.0, 0.0]], floats),
        "response_mask": pa.array([[1.0, 1.0], [1.0, 1.0]], floats),
        "old_logprobs": pa.array([[-1.0, -1.0], [-2.0, -2.0]], floats),
        "ref_logprobs": pa.array([[-1.5, -1.0], [-2.0, -1.0]], floats),
    })


# ------------------------------------------------------------------------------- the algorithm core
def add_advantage_estimator(outside, tmp_path):
    from flowrl.algos import ADVANTAGE_ESTIMATORS
    from flowrl.nodes.advantages import advantages

    mod = outside("""
        from flowrl.algos import broadcast_rows, register_estimator, row_scores

        @register_estimator("where_to_add_batch_mean", needs_values=True)  # needs_values: starts the critic
        def batch_mean(inputs, *, gamma=1.0, lam=1.0, norm_adv_by_std=True):
            scores = row_scores(inputs)
            adv = broadcast_rows(scores - scores.mean(), inputs)
            return adv, adv
    """)
    try:
        cfg = load_config(None, [f"algorithm.adv_estimator={mod}:batch_mean"])
        assert cfg.needs_critic  # the trait, read from the decorated function
        table = advantages(_experience().append_column("values", pa.array([[0.0, 0.0]] * 2, pa.list_(pa.float32()))),
                           estimator=f"{mod}:batch_mean", gamma=1.0, lam=1.0, norm_adv_by_std=True)
        # scores 1 and 0, batch mean 0.5: +0.5 and -0.5 on each row's tokens
        assert table.column("advantages").to_pylist() == [[0.5, 0.5], [-0.5, -0.5]]
    finally:
        ADVANTAGE_ESTIMATORS.unregister("where_to_add_batch_mean")


def add_policy_loss(outside, tmp_path):
    import torch

    from flowrl.algos import POLICY_LOSSES
    from flowrl.algos.actor_loss import ActorLoss, actor_loss

    mod = outside("""
        def reinforce(logp_T, old_logp_T, advantages_T, response_mask_T, cu_seqlens_B1, **clip):
            return -advantages_T * logp_T, {"where_to_add_calls": logp_T.new_ones(())}
    """)
    cfg = load_config(None, [f"actor.policy_loss={mod}:reinforce"])
    with pytest.raises(ConfigError, match=r"actor.policy_loss=.*is not an importable policy loss") as err:
        load_config(None, [f"actor.policy_loss={mod}:no_such_loss"])
    assert err.value.key == "actor.policy_loss" and "package.module:function" in err.value.fix
    spec = ActorLoss(policy_loss=POLICY_LOSSES.get(cfg.actor.policy_loss), kl_estimator=lambda a, b: a * 0,
                     mode="token-mean", max_response_length=2, use_old_logprobs=False, clip_ratio_low=0.2,
                     clip_ratio_high=0.2, clip_ratio_c=3.0, entropy_coeff=0.0, use_kl_loss=False, kl_loss_coef=0.0)
    fields = {"advantages": torch.tensor([1.0, 1.0, -1.0, -1.0]), "response_mask": torch.ones(4)}
    loss, stats = actor_loss(torch.tensor([-1.0, -1.0, -2.0, -2.0]), None, fields, torch.tensor([0, 2, 4]),
                             spec=spec, denominator=4.0)
    # -A * logp per token: 1, 1, -2, -2; token-mean over 4 tokens: -0.5
    assert float(loss) == pytest.approx(-0.5) and float(stats["where_to_add_calls"]) == 1.0


def add_kl_estimator(outside, tmp_path):
    from flowrl.nodes.advantages import kl_in_reward

    mod = outside("""
        def squared(logp_T, ref_logp_T):
            return (logp_T - ref_logp_T) ** 2
    """)
    cfg = load_config(None, [f"actor.kl_loss_type={mod}:squared", f"algorithm.kl_penalty={mod}:squared"])
    assert cfg.actor.kl_loss_type == cfg.algorithm.kl_penalty == f"{mod}:squared"
    with pytest.raises(ConfigError, match="algorithm.kl_penalty"):
        load_config(None, ["algorithm.kl_penalty=no_such_module_here:squared"])
    out = kl_in_reward(_experience(), coef=1.0, estimator=cfg.algorithm.kl_penalty)
    # (old - ref)^2 per token: row 0 [0.25, 0], row 1 [0, 1]; rewards minus that
    assert out.value.column("token_rewards").to_pylist() == [[-0.25, 1.0], [0.0, -1.0]]


# ------------------------------------------------------------------------------- families and engines
def add_algorithm_family(outside, tmp_path):
    from flowrl.graphs.family import Family, IterationGraph, resolve_family

    mod = outside("""
        from flowrl.graphs.family import Family, IterationGraph

        class NoGroups(Family):
            def group_specs(self):
                return []

            def build(self, ctx, prompts, *, step, collected=None):
                return IterationGraph(result=("built", step), sync=None)
    """)
    cfg = load_config(None, [f"algorithm.family={mod}:NoGroups"])
    cls = resolve_family(cfg)
    assert cls.__module__ == mod and issubclass(cls, Family)
    graph = cls(cfg).build(None, pa.table({"group": [0]}), step=7)
    assert isinstance(graph, IterationGraph) and graph.result == ("built", 7)


def add_backend(outside, tmp_path):
    from flowrl.backends.interfaces import SamplingParams
    from flowrl.catalog.backends import GEN_BACKENDS, GenerateBackendSpec, ReshardMode, ShardStyle
    from flowrl.roles.rollout import RolloutRole

    mod = outside("""
        class Repeat:
            '''A generate engine: each response repeats its prompt's last token.'''

            def __init__(self, model_dir, **kwargs):
                self.weights = {}

            def generate(self, prompts, params, *, seed=0, micro_batch_size=256):
                out = [[p[-1]] * params.max_new_tokens for p in prompts for _ in range(params.n)]
                return out, [[0.0] * len(r) for r in out]

            def logprobs(self, prompts, responses, *, temperature=1.0):
                return [[0.0] * len(r) for r in responses]

            def load_hf_state(self, state):
                self.weights = dict(state)

            def reshard_target(self):
                return self.weights

            def sleep(self): ...

            def wake_up(self): ...

            def close(self): ...
    """)
    name = f"repeat_{mod[-6:]}"
    GEN_BACKENDS.add(GenerateBackendSpec(name=name, engine=f"{mod}:Repeat", shard_style=ShardStyle.HF,
                                         reshard=ReshardMode.IN_PLACE, in_process=False))
    try:
        assert load_config(None, [f"rollout.name={name}"]).rollout.name == name
        role = RolloutRole(rank=0, world_size=1, model_dir="unused", backend=name,
                           sampling=SamplingParams(n=1, max_new_tokens=2))
        out = role.generate(pa.table({"prompt_ids": [[5, 7]], "group": [0]}))
        assert out.column("response_ids").to_pylist() == [[7, 7]]
    finally:
        GEN_BACKENDS.unregister(name)


# ------------------------------------------------------------------------------- rewards and tools
def add_reward_function(outside, tmp_path):
    from flowrl.rewards import REWARD_FUNCTIONS, resolve_reward_fn
    from flowrl.run.preflight import check_reward_fn

    mod = outside("""
        from flowrl.rewards import REWARD_FUNCTIONS

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return {"score": float(solution_str.strip() == ground_truth), "turns": extra_info["num_turns"] or 0}

        REWARD_FUNCTIONS.register("where_to_add_exact", compute_score)
    """)
    cfg = load_config(None, [f"algorithm.reward_fn={mod}:compute_score"])
    check_reward_fn(cfg)  # the pre-flight check, before any worker starts
    fn = resolve_reward_fn(cfg.algorithm.reward_fn)
    assert fn("d", " 42 ", "42", {}) == {"score": 1.0, "turns": 0}  # called as verl calls it
    try:
        assert resolve_reward_fn("where_to_add_exact")("d", "41", "42", None)["score"] == 0.0  # by name
    finally:
        REWARD_FUNCTIONS.unregister("where_to_add_exact")
    with pytest.raises(ConfigError, match="algorithm.reward_fn"):
        check_reward_fn(load_config(None, [f"algorithm.reward_fn={mod}:no_such_fn"]))


def add_tool(outside, tmp_path):
    from flowrl.agents.tools import resolve_tools

    mod = outside("""
        from flowrl.agents.tools import Tool

        class Upper(Tool):
            name = "upper"
            schema = {"name": "upper", "description": "Upper-case a text.",
                      "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}

            def create_state(self, row):
                return {"calls": 0}

            async def call(self, args, state):
                state["calls"] += 1
                return args["text"].upper()

            def reward(self, state):
                return 0.5 * state["calls"]
    """)
    cfg = load_config(None, ["rollout.multi_turn.enable=true", f"rollout.multi_turn.tools=[{mod}:Upper]"])
    tools = resolve_tools(cfg.rollout.multi_turn.tools)
    state = tools["upper"].create_state({})
    assert asyncio.run(tools["upper"].call({"text": "abc"}, state)) == "ABC" and tools["upper"].reward(state) == 0.5
    assert tools["upper"].chat_schema()["function"]["name"] == "upper"
    with pytest.raises(ConfigError, match="rollout.multi_turn.tools"):
        load_config(None, ["rollout.multi_turn.enable=true", f"rollout.multi_turn.tools=[{mod}:Nothing]"])


# ------------------------------------------------------------------------------- metrics and nodes
def add_metric(outside, tmp_path):
    from flowrl.metrics import JsonlLogger, read_metrics
    from flowrl.metrics.groups import metric_group
    from flowrl.nodes.core import NodeOut, _run_node

    mod = outside("""
        from flowrl.nodes.core import NodeOut

        SOLVED_FRAC = "my_task/solved_frac"  # the name, once; a built-in's goes in flowrl/catalog/metric_names.py

        def solved(table):
            scores = table.column("score").to_pylist()
            return NodeOut(table, {SOLVED_FRAC: sum(s > 0 for s in scores) / len(scores)})
    """)
    user = __import__(mod)
    out = _run_node("solved", user.solved, pa.table({"score": [1.0, 0.0, 1.0, 1.0]}))
    assert isinstance(out, NodeOut) and out.metrics[user.SOLVED_FRAC] == 0.75
    assert metric_group(user.SOLVED_FRAC) == "my_task"  # its own dashboard section
    logger = JsonlLogger(tmp_path / "metrics.jsonl")  # what the run writes each step
    logger.log(1, out.metrics)
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl")[-1][user.SOLVED_FRAC] == 0.75


def add_graph_node(outside, tmp_path):
    from flowrl.metrics import names
    from flowrl.nodes.core import NodeOut, node

    mod = outside("""
        import pyarrow.compute as pc

        def keep_positive(table):
            return table.filter(pc.greater(table.column("score"), 0))
    """)
    user = __import__(mod)
    out = node("keep_positive", user.keep_positive, pa.table({"score": [1.0, -1.0, 2.0]}), step=3).compute(
        scheduler="sync")
    assert isinstance(out, NodeOut) and out.value.column("score").to_pylist() == [1.0, 2.0]
    assert names.timing("keep_positive") in out.metrics and "keep_positive" in out.spans


CASES = {
    "advantage estimator": add_advantage_estimator,
    "policy loss": add_policy_loss,
    "kl estimator": add_kl_estimator,
    "algorithm family": add_algorithm_family,
    "backend": add_backend,
    "reward function": add_reward_function,
    "tool": add_tool,
    "metric": add_metric,
    "graph node": add_graph_node,
}
"""An item of the list (as :func:`where_to_add_items` spells it) -> the addition, performed."""


def test_every_bullet_has_a_case_and_every_case_a_bullet():
    items = where_to_add_items()
    assert not [i for i in items if i not in CASES], "ARCHITECTURE.md lists additions without a case here"
    assert not [c for c in CASES if c not in items], "cases here for additions ARCHITECTURE.md no longer lists"


@pytest.mark.parametrize("item", where_to_add_items())
def test_the_addition_takes_effect(item, outside, tmp_path):
    if item not in CASES:
        pytest.fail(f"ARCHITECTURE.md says how to add {item!r}: add a case performing it to CASES")
    CASES[item](outside, tmp_path)

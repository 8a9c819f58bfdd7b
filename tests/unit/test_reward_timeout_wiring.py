"""reward_model.reward_timeout_s reaches the reward node the families build: the graph's reward
node is called with the configured timeout."""

from __future__ import annotations

from types import SimpleNamespace

from flowrl.config import load_config


def _timeout_of(delayed_node) -> float:
    # node(name, fn, *args) -> delayed(_run_node)(name, fn, *args): the timeout is the last argument
    graph = dict(delayed_node.__dask_graph__())
    task = graph[delayed_node.key]
    args = getattr(task, "args", None) or task[1:]
    values = [getattr(a, "value", a) for a in args]
    return values[-1]


def test_the_configured_reward_timeout_reaches_the_reward_node():
    from flowrl.graphs import pieces

    cfg = load_config(None, ["reward_model.reward_timeout_s=7.5"])
    ctx = SimpleNamespace(cfg=cfg, tokenizer_dir="tok", groups={})
    scored = pieces.score(ctx, [], step=3)  # no reward model, no overlong shaping: the reward node itself
    assert scored.key == "reward-000003"
    assert _timeout_of(scored) == 7.5

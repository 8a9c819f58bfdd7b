"""Graph nodes: the bodies of the Dask tasks that ``flowrl.graphs`` wires together, grouped by
what they do.

- :mod:`~flowrl.nodes.core`: :func:`node` (a body as the task ``<name>-<step:06d>``) and
  :class:`NodeOut` (value, metrics, spans);
- :mod:`~flowrl.nodes.generation`: responses from the rollout group;
- :mod:`~flowrl.nodes.rewards`: the reward function, the reward model, overlong shaping, ReMax's
  baseline scoring;
- :mod:`~flowrl.nodes.scoring`: per-token model calls (log-probs, critic values);
- :mod:`~flowrl.nodes.advantages`: the KL reward penalty, advantages, the dynamic-sampling filter;
- :mod:`~flowrl.nodes.updates`: the actor's and the critic's update;
- :mod:`~flowrl.nodes.weights`: the weight sync and the colocated engine's release;
- :mod:`~flowrl.nodes.results`: the step's result and its data metrics.

Every body is also importable from here (``from flowrl import nodes; nodes.generate``), the
face a custom graph uses (``notebooks/customise_graph.ipynb``).
"""

from flowrl.nodes.advantages import advantages, filter_groups, filter_metric, kl_in_reward, rollout_correction
from flowrl.nodes.core import NodeOut, join_columns, node
from flowrl.nodes.generation import generate, generate_greedy, generate_val
from flowrl.nodes.results import collect, collect_with_values, data_metrics, value_metrics
from flowrl.nodes.rewards import (
    combine_rewards,
    load_tokenizer,
    outcome_token_rewards,
    overlong,
    reward,
    reward_baseline,
    rm_scores,
)
from flowrl.nodes.scoring import logprobs, values
from flowrl.nodes.updates import critic_warmup, update, update_critic
from flowrl.nodes.weights import build_reshard, release_rollout, reshard, reshard_metrics

__all__ = [
    "NodeOut", "advantages", "critic_warmup", "build_reshard", "collect", "collect_with_values", "combine_rewards", "data_metrics",
    "filter_groups", "filter_metric", "generate", "generate_greedy", "generate_val", "join_columns", "kl_in_reward",
    "load_tokenizer", "logprobs", "node", "outcome_token_rewards", "overlong", "release_rollout", "reshard",
    "reshard_metrics", "reward", "rollout_correction", "reward_baseline", "rm_scores", "update", "update_critic", "value_metrics", "values",
]

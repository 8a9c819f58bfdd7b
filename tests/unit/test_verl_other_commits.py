"""verl's example (and recipe) scripts of other commits than the fixture's b178a3cd (issue 37's
"the same on verl example scripts of other commits"), through ``flowrl config --from-verl``.

``benchmarks/verl_catalogue.py`` measured v0.3.0.post1, v0.4.0, v0.4.1, v0.5.0, 1df03f3ab, 515068653,
v0.6.0, v0.6.1, 9f3199f58 and v0.7.0 (``examples/``; ``recipe/`` of v0.4.1 to v0.7.0).
``data/verl_other_commits_argv.txt`` keeps the distinct lists among them that verl 0.9.1 composes and
that exercised something the b178a3cd fixture does not: a refusal that was not by name, or a key no
fixture list sets. One list a line: commit, script, a tab-separated shell-quoted argument list.
A list naming a config directory of its own (``/verl/<dir>``) reads that commit's YAML files, kept
verbatim under ``data/verl_configs/<commit>/<dir>``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from flowrl.config.verl_yaml import verl_config_dir
from test_verl_examples import classify

DATA = Path(__file__).parent / "data"
ARGV = DATA / "verl_other_commits_argv.txt"

pytestmark = pytest.mark.skipif(verl_config_dir() is None, reason="verl's config tree is absent: "
                                "pip install --no-deps verl==0.9.1 (as .ci/run does)")

def other_lists() -> list[tuple[str, str, list[str]]]:
    out = []
    for line in ARGV.read_text().splitlines():
        if line and not line.startswith("#"):
            commit, script, args = line.split("\t", 2)
            out.append((commit, script, [a.replace("/verl/", f"{DATA}/verl_configs/{commit}/") for a in
                                         shlex.split(args)]))
    return out


def _cases():
    return [pytest.param(args, id=f"{commit}:{script}") for commit, script, args in other_lists()]


@pytest.mark.parametrize("args", _cases())
def test_each_list_is_accepted_or_refused_by_name(args):
    kind, lines = classify(args)
    assert kind in ("accepted", "named"), lines


def test_megatron_ignores_enable_gradient_checkpointing_as_verl_does():
    """verl 0.3/0.4's Megatron scripts set model.enable_gradient_checkpointing=True, which verl 0.9.1's
    Megatron engine never reads: accepted with a note, not the pre-flight's refusal of flowrl's own key."""
    args = ["--config-name=ppo_megatron_trainer", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.model.enable_gradient_checkpointing=True"]
    assert classify(args) == ("accepted", [])
    # under FSDP verl reads it, and so does flowrl
    from flowrl.cli import _split_config_args, build_parser
    from flowrl.config.loader import load_config_with_notes

    fsdp = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.enable_gradient_checkpointing=True"]
    ns = build_parser().parse_args(["config", "--from-verl", *fsdp])
    cfg, _, _ = load_config_with_notes(*_split_config_args(ns.items, ns))
    assert cfg.model.enable_gradient_checkpointing is True


def test_verls_spelling_of_a_key_whose_path_is_flowrls():
    """algorithm.filter_groups.metric is the same path in verl and flowrl: verl's "reward" is flowrl's
    seq_reward (it was refused as not one of flowrl's names)."""
    args = ["actor_rollout_ref.rollout.name=vllm", "algorithm.filter_groups.enable=True",
            "algorithm.filter_groups.metric=reward"]
    assert classify(args) == ("accepted", [])


def test_a_key_a_users_file_adds_under_a_feature_left_off_is_inert(tmp_path):
    """recipe/fapo's rm_config.yaml (v0.6.1) writes reward_model.model.type with reward_model.enable
    false: verl reads nothing under a feature left off, nor does flowrl (it was an unknown key)."""
    (tmp_path / "rm.yaml").write_text("defaults:\n  - ppo_trainer\n  - _self_\n\nreward_model:\n  enable: False\n"
                                      "  model:\n    type: discriminative\n")
    args = [f"--config-path={tmp_path}", "--config-name=rm", "actor_rollout_ref.rollout.name=vllm"]
    assert classify(args) == ("accepted", [])


def test_an_empty_gpu_count_is_a_config_error_not_a_crash():
    """verl v0.5.0's langgraph_agent script passes `trainer.n_gpus_per_node=` when its variable is
    unset: a named config error (it crashed with a bare ValueError in the batch arithmetic)."""
    kind, lines = classify(["actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=",
                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
    assert kind != "crash" and any("trainer.n_gpus_per_node" in line and "whole number" in line for line in lines), (kind, lines)

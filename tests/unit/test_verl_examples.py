"""verl's own example catalogue through ``flowrl config --from-verl`` (issue 37).

``data/verl_example_argv.txt`` holds the argument lists of ``python3 -m verl.trainer.main_ppo`` in
verl's example scripts (volcengine/verl at b178a3cd, January 2026), recorded by running each
``examples/**/*.sh`` with a fake ``python3`` (and fake ``ray``, ``nvidia-smi``, ``wget``, ...) first on
``PATH``, each under ``timeout 10``; kept are the 76 of the 120 lists that verl 0.9.1 composes with
Hydra against its wheel's config tree (``python benchmarks/verl_catalogue.py b178a3cd5 --argv-out DIR``
writes them again; the tool also measures other commits). Each list is fed to flowrl as it is and counted as accepted,
refused by name (a feature flowrl lacks, named), an unknown key, a value refused, or a Hydra flag
refused.

Ten lists name a config directory of their own (``--config-path=/verl/examples/sglang_multiturn/config``,
whose YAML files extend verl's ``ppo_trainer``/``ppo_megatron_trainer``): the test writes stand-ins
of those files (the defaults list and the rollout engine) into a temporary directory.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from collections import Counter
from pathlib import Path

import pytest

from flowrl.config.verl_yaml import verl_config_dir


def _load_catalogue():
    """``benchmarks/verl_catalogue.py`` (the capture tool), whose ``classify`` these tests share."""
    spec = importlib.util.spec_from_file_location("bench_verl_catalogue", Path(__file__).resolve().parents[2]
                                                  / "benchmarks" / "verl_catalogue.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


catalogue = _load_catalogue()
classify = catalogue.classify

DATA = Path(__file__).parent / "data" / "verl_example_argv.txt"
USER_DIR = "/verl/examples/sglang_multiturn/config"

pytestmark = pytest.mark.skipif(verl_config_dir() is None, reason="verl's config tree is absent: "
                                "pip install --no-deps verl==0.9.1 (as .ci/run does)")


def example_lists() -> list[tuple[str, list[str]]]:
    out = []
    for line in DATA.read_text().splitlines():
        if line and not line.startswith("#"):
            script, _, args = line.partition("\t")
            out.append((script, shlex.split(args)))
    return out


def write_user_configs(directory: Path) -> None:
    """Stand-ins of verl's ``examples/sglang_multiturn/config/*.yaml``: a user's directory whose
    defaults extend verl's trainer config."""
    for name in ("geo3k_multiturn_grpo", "gsm8k_multiturn_grpo", "gsm8k_multiturn_grpo_server",
                 "gsm8k_multiturn_grpo_w_interaction", "search_multiturn_grpo", "geo3k_multiturn_megatron_grpo",
                 "gsm8k_multiturn_megatron_grpo"):
        base = "ppo_megatron_trainer" if "megatron" in name else "ppo_trainer"
        (directory / f"{name}.yaml").write_text(
            f"defaults:\n  - {base}\n  - _self_\n\ndata:\n  max_prompt_length: 1024\n  return_raw_chat: true\n\n"
            "actor_rollout_ref:\n  rollout:\n    name: sglang\n    multi_turn:\n      enable: true\n")


def measure(tmp_path: Path) -> tuple[Counter, dict[str, list[str]]]:
    write_user_configs(tmp_path)
    counts, errors = Counter(), {}
    for script, args in example_lists():
        args = [a.replace(USER_DIR, str(tmp_path)) for a in args]
        kind, lines = classify(args)
        counts[kind] += 1
        errors[script] = [kind, *lines]
    return counts, errors


def test_the_fixture_holds_the_76_lists_verl_accepts():
    lists = example_lists()
    assert len(lists) == 76 and len({s for s, _ in lists}) == 76
    assert sum(any(a.startswith("--config-name") for a in args) for _, args in lists) == 23


def test_the_catalogue_counts(tmp_path):
    """Issue 37's measure, recounted on the 76 lists: before it, 4 accepted, 23 Hydra flags refused
    (every --config-path/--config-name list), 34 with an unknown key, 15 with a verl value refused.
    Then (7fc73b1): 29 accepted, 15 refused by name, 32 with another refusal. Now 29 / 35 / 12: a
    named refusal is reported once, without the checks that fail only because of it (an SGLang or
    TensorRT-LLM list no longer gets the hf fallback's tensor-parallel refusal; a refused multi-turn
    tool config no longer leaves an empty rollout.multi_turn.tools behind: KNOCK_ON); verl's gpg and
    optimal_token_baseline estimators, geo_mean loss and mlflow logger are refused as missing
    features by name; ``bf16`` in fsdp_config.mixed_precision is bfloat16; verl's critic.enable=null
    with gae keeps the Megatron config's critic.strategy. Then 29 / 35 / 12; now 33 / 43 / 0: verl's
    global micro-batch sizes are divided over the GPUs as verl's workers do (3 tuning lists), FSDP1's
    forward_prefetch is accepted with its reason (1), an empty ``use_kl_loss=`` is false as in verl,
    greedy validation with val_kwargs.n > 1 decodes n times as in verl, and the refusals left are worded
    as the feature flowrl lacks: saving Megatron's distributed optimizer (7 lists), token-budget
    micro-batches under Megatron, deriving the run's length from the data for a warm-up. Now 39 / 37 /
    0: Megatron's distributed optimizer is checkpointed (6 of those 7 lists accepted; the seventh,
    run_qwen2-7b_math_megatron_lora.sh, is still refused for token-budget micro-batches under Megatron).
    Now 42 / 34 / 0: verl's gpg estimator and loss (both gpg_trainer lists) and geo_mean loss (GMPO:
    gmpo_trainer/run_qwen2_5-7b_math.sh; its two DAPO lists are still refused for Ulysses and verl's
    dapo reward manager) are built; verl's rollout_correction.rollout_is (decoupled mode) maps to
    flowrl's rollout correction, and its two example lists stay refused by name for bypass mode,
    rejection sampling (rollout_rs) and batch-normalized weights. Now 44 / 32 / 0: verl's bypass mode
    (REINFORCE or PPO clip against the rollout's log-probs, batch-normalized weights, rejection sampling
    with verl's k1/k2/k3 options: flowrl.algos.rollout_correction) takes both rollout_correction lists.
    Now 45 / 31 / 0: model.lora_adapter_path continues training from a saved peft adapter
    (grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora_from_adapter.sh).
    Then 49 / 27 / 0: Ulysses sequence parallelism (issue 31) takes the three
    tuning/*_grpo-lora_*_fsdp_vllm.sh lists and grpo_trainer/run_qwen3-32b_npu.sh.
    Then 50 / 26 / 0: verl's multi-turn tool config (rollout.multi_turn.tool_config_path: verl's
    Gsm8kTool as flowrl.agents.verl_tools.Gsm8kTool, or flowrl Tool classes) takes
    sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh. Then 51 / 25 / 0: verl's optimal_token_baseline
    estimator (sum_pi_squared from the actor's pre-update pass) takes otb_trainer/run_qwen2_5-7b.sh.
    Then 52 / 24 / 0: actor.freeze_vision_tower maps to flowrl's (dp, fsdp): run_qwen2_5_vl-7b_freeze_vision.sh.
    Then 53 / 23 / 0: model.exclude_modules (peft's regex, flowrl.models.lora) takes run_qwen2_5_vl-7b_lora.sh.
    Then 54 / 22 / 0: verl's dapo reward manager is flowrl's reward stage with its overlong penalty
    (reward_kwargs.overlong_buffer_cfg -> reward_model.overlong_buffer, flowrl.config.verl_reward):
    gmpo_trainer/test_dapo_qwen3_30b_math.sh (test_dapo_7b_math.sh stays refused for override_config)."""
    counts, _ = measure(tmp_path)
    assert counts["unknown"] == 0 and counts["hydra"] == 0 and counts["preflight"] == 0
    assert (counts["accepted"], counts["named"], counts["value"]) == (54, 22, 0)

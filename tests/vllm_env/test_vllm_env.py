"""Run the vLLM checks (``check_*.py`` here) with the vLLM environment's python.

vLLM pins torch and transformers, so it lives in its own venv (``setup_env.sh``, which CI runs
first): ``$FLOWRL_VLLM_ENV``, default ``/opt/flowrl-vllm``. Without that environment these tests
skip, saying how to create it.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
ENV_DIR = Path(os.environ.get("FLOWRL_VLLM_ENV", "/opt/flowrl-vllm"))
PYTHON = ENV_DIR / "bin" / "python"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not PYTHON.exists(),
        reason=f"no vLLM environment at {ENV_DIR} (create it with `bash tests/vllm_env/setup_env.sh`, "
        "or point FLOWRL_VLLM_ENV at one)",
    ),
]


@pytest.fixture(scope="module", autouse=True)
def env_sees_this_checkout():
    """The environment's editable flowrl must be this checkout (CI clones elsewhere)."""
    probe = "import flowrl, flowrl.graphs; print(flowrl.__file__); print(flowrl.graphs.__file__)"
    proc = subprocess.run([str(PYTHON), "-c", probe], cwd="/", capture_output=True, text=True, timeout=120)
    paths = [Path(p).resolve() for p in proc.stdout.split()] if proc.returncode == 0 else []
    if len(paths) != 2 or not all(p.is_relative_to(ROOT.resolve()) for p in paths):
        subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)],
                       check=True, capture_output=True, timeout=300)


def _run_checks(name: str, timeout: int) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"), HF_HUB_OFFLINE="1")
    cmd = [str(PYTHON), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", f"--timeout={timeout}",
           "-o", "python_files=check_*.py", str(HERE / name)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{name} in {ENV_DIR} ran past {timeout + 60}s:\n{(exc.stdout or '')[-4000:]}")
    sys.stdout.write(proc.stdout[-3000:])
    assert proc.returncode == 0, f"{name} failed in {ENV_DIR}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in proc.stdout.splitlines()[-1]


def test_weight_update_payload_passes_vllms_serializer_and_parsers():
    _run_checks("check_weight_payload.py", timeout=120)


def test_split_nccl_weight_sync_payloads_pass_vllms_parsers_and_its_nccl_engine():
    _run_checks("check_nccl_payload.py", timeout=120)


def test_vlm_prompts_reach_vllms_placeholder_expansion_as_flowrl_expanded_them():
    _run_checks("check_mm_placeholders.py", timeout=120)


def test_engine_in_the_callers_process_through_the_external_launcher():
    _run_checks("check_external_launcher.py", timeout=200)


def test_vllm_matches_hf_on_the_same_weights():
    _run_checks("check_parity.py", timeout=400)


def test_lora_adapter_in_vllm_matches_the_merged_weights():
    _run_checks("check_lora.py", timeout=400)


def test_grpo_with_lora_syncs_only_the_adapters_to_vllm():
    _run_checks("check_lora_grpo.py", timeout=900)


def test_grpo_with_vllm_rollout_raises_the_reward():
    _run_checks("check_grpo.py", timeout=500)


def test_multi_turn_tool_rollouts_on_vllm():
    _run_checks("check_agent.py", timeout=400)


def test_vision_language_generation_and_weight_sync():
    _run_checks("check_vlm.py", timeout=300)


def test_vision_language_grpo_on_vllm_hybrid_and_split():
    _run_checks("check_vlm_grpo.py", timeout=500)


def test_mixture_of_experts_generation_and_weight_sync():
    _run_checks("check_moe.py", timeout=400)


def test_the_rollout_sections_engine_settings_reach_the_engine():
    _run_checks("check_engine_settings.py", timeout=120)

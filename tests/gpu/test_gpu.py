"""GPU checks, skipped without CUDA. Each prepared script runs in its own process with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HERE = os.path.dirname(os.path.abspath(__file__))


def test_megatron_parity_gpu():
    pytest.importorskip("megatron.core")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "megatron_parity_gpu.py")],
                          capture_output=True, text=True, timeout=1500)
    print(proc.stdout[-5000:])
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]


def test_vllm_gpu():
    """Official vLLM on CUDA: parity, weight transfer over CUDA IPC, sleep/wake (vllm_gpu.py)."""
    pytest.importorskip("vllm")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "vllm_gpu.py")],
                          capture_output=True, text=True, timeout=1200)
    print(proc.stdout[-5000:])
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]


def test_fsdp_gpu():
    """FSDP2 over NCCL against dp on the CPU; GPU checkpoint restored under dp (fsdp_gpu.py)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "fsdp_gpu.py")],
                          capture_output=True, text=True, timeout=900, env=env)
    print(proc.stdout[-5000:])
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]


def test_stream_vllm_gpu():
    """Stream mode with partial rollouts through vLLM: prompts once, versions bounded (stream_vllm_gpu.py)."""
    pytest.importorskip("vllm")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "stream_vllm_gpu.py")],
                          capture_output=True, text=True, timeout=900, env=env)
    print(proc.stdout[-5000:])
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]


def test_lora_vllm_gpu():
    """GRPO with LoRA into vLLM: each sync sends the adapters only; vLLM with the adapter equals
    hf on the merged weights (lora_vllm_gpu.py)."""
    pytest.importorskip("vllm")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "lora_vllm_gpu.py")],
                          capture_output=True, text=True, timeout=900, env=env)
    print(proc.stdout[-5000:])
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]

"""Shared fixtures: a tiny model directory and addition prompts, built in code (no hub)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# TensorBoard's files go where verl's do, tensorboard_log/ under the working directory, unless
# $TENSORBOARD_DIR says otherwise: the suite's runs (and the processes they start) write to a
# temporary folder, not into the checkout
if "TENSORBOARD_DIR" not in os.environ:
    import tempfile

    os.environ["TENSORBOARD_DIR"] = tempfile.mkdtemp(prefix="flowrl-tests-tensorboard-")

# tests/ on the path of this process and of every process it spawns (Dask workers, torch
# multiprocessing), so test-only helpers resolve by import string: ``flowrl_testing.<module>``.
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
if _TESTS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_TESTS, os.environ.get("PYTHONPATH", "")) if p)


def build_tiny_model_dir(path: Path, *, seed: int = 0, **overrides) -> Path:
    from flowrl.models.char_tokenizer import build_char_tokenizer
    from flowrl.models.tiny import build_tiny_model

    tok = build_char_tokenizer()
    kwargs = dict(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, seed=seed)
    kwargs.update(overrides)
    model = build_tiny_model(tok, **kwargs)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def addition_data(tmp_path_factory) -> tuple[Path, Path]:
    from flowrl.tasks.arithmetic import write_addition_parquet

    return write_addition_parquet(tmp_path_factory.mktemp("addition"), 256, 32, 0)


def pytest_configure(config):
    """One fork server for the whole session, preloaded with what both the Dask workers
    (``flowrl.cluster.worker_start``) and the multi-process megatron tests
    (``flowrl_testing.megatron.spawn``) import, whichever starts it first: each of their
    processes is then a fork with those imports done, not a fresh interpreter."""
    import multiprocessing

    from flowrl.cluster.worker_start import PRELOAD

    megatron = ("flowrl.backends.train.megatron.engine", "transformers.models.llama.modeling_llama",
                "transformers.models.qwen2.modeling_qwen2", "transformers.modeling_utils",
                "transformers.generation.utils")
    multiprocessing.get_context("forkserver").set_forkserver_preload(["distributed", *PRELOAD, *megatron])

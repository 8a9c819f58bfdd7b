"""GRPO through the CLI with a vision-language model on ``rollout.name=vllm`` (CPU build; issue 33):
``configs/vlm_shapes.yaml``'s task (its pictures and questions, reward by exact match) with a tiny
Qwen2-VL vLLM's CPU attention runs (head_dim 32; ``tests/gpu/vlm_vllm_gpu.py``'s model, not warmed
up: the score is not the point here), FSDP2 trainer at dp 2, vLLM at tp 2:

* ``hybrid`` (the default for vLLM): each trainer process holds its half of one engine (external
  launcher); the sync all-gathers the FSDP shards into whole HF-named tensors on each rank and each
  engine rank loads them (vision tower included);
* ``split``: the engine on processes of its own; the reshard moves the whole parameters into
  vLLM's staging layout (``flowrl.parallel.named_spec``: rows over the 2 tp ranks), the engine rank
  assembles and loads them.

Each run: every step's engine log-probs equal the trainer's recomputed ones with the images (the
engine holds the trainer's weights: ``rollout/logprob_diff_max``), and the weight-sync fingerprints
(``trainer.checks.weight_sync``, on by default as an error) found nothing. Runs in the vLLM
environment (``test_vllm_env.py``)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from vlm_vllm_gpu import build_vlm  # noqa: E402

from flowrl.tasks.files import write_parquet  # noqa: E402
from flowrl.tasks.vlm_shapes import make_rows  # noqa: E402

STEPS = 3
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    out = tmp_path_factory.mktemp("vlm_task")
    write_parquet(out, make_rows(64, 0, "train"), "train.parquet")
    return build_vlm(out / "model"), out / "train.parquet"


@pytest.mark.parametrize("placement", ["hybrid", "split"])
def test_vlm_grpo_on_vllm(task, placement, tmp_path):
    model, data = task
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "flowrl.cli", "train", "configs/vlm_shapes.yaml", f"model.path={model}",
           f"data.train_files={data}", f"trainer.run_dir={run_dir}", f"trainer.total_training_steps={STEPS}",
           "rollout.name=vllm", "rollout.enforce_eager=true", f"cluster.placement={placement}",
           "actor.strategy=fsdp", "actor.data_parallel_size=2", "rollout.data_parallel_size=1",
           "rollout.tensor_model_parallel_size=2", "data.train_batch_size=8", "rollout.n=4",
           "actor.ppo_mini_batch_size=4"]  # two optimizer steps: the old-log-prob pass runs
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert f"done: {STEPS} steps" in proc.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        assert ("timing_s/reshard" in row) == (row["step"] > 1)
        assert row["rollout/logprob_diff_max"] < 1e-4, row["rollout/logprob_diff_max"]
    print(placement, [(r["step"], round(r["rollout/logprob_diff_max"], 7), r.get("reshard/bytes")) for r in rows])

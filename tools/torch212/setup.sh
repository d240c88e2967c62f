#!/usr/bin/env bash
# Makes .venv-torch212 (`make test-torch212`): torch 2.12.1 from PyPI plus
# tools/torch212/requirements.txt.
#
# PyPI's x86_64 torch 2.12.1 is a CUDA build, and even its CPU path needs the
# CUDA runtime: libtorch_cpu.so links libcudart and libcupti, libtorch.so
# links libtorch_cuda.so, which links cuBLAS, cuDNN, NCCL, cuFFT, ... So a
# `--no-deps` torch does not import. The smallest sound set: torch with
# --no-deps, then exactly the wheels whose libraries those .so files link (its
# own Requires-Dist, at torch's pins), leaving out what no import loads:
# triton (the GPU compiler) and cuda-bindings (Python CUDA bindings).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-torch212
PYTHON="${PYTHON:-python3}"
WHEEL=.cache/wheels/torch-2.12.1-cp311-cp311-manylinux_2_28_x86_64.whl
if [[ ! -f $WHEEL ]]; then
  mkdir -p .cache/wheels
  "$PYTHON" -m pip download torch==2.12.1 --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --python-version 3.11 -d .cache/wheels
fi
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet --no-deps "$WHEEL"
# torch's own requirements on Linux, minus triton and cuda-bindings (see above).
unzip -p "$WHEEL" 'torch-2.12.1.dist-info/METADATA' \
  | sed -n 's/^Requires-Dist: //p' | grep -v 'extra ==' \
  | grep -v -E '^(triton|cuda-bindings|setuptools)\b' | sed 's/; platform_system == "Linux"//' \
  > "$VENV/torch-runtime-requirements.txt"
"$VENV/bin/python" -m pip install --quiet -r "$VENV/torch-runtime-requirements.txt" -r tools/torch212/requirements.txt
"$VENV/bin/python" -c 'import torch; assert torch.__version__.startswith("2.12"), torch.__version__; print("torch", torch.__version__)'
touch "$VENV/.installed"

#!/usr/bin/env bash
# Download, on a machine with pip access, the wheels a GPU machine without a registry lacks
# (it has torch, lightning, numpy, h5py, tifffile, matplotlib, tensorboard and rich; not monai,
# hydra-core, omegaconf, antlr4 or nibabel) into .whl/ (git-ignored), for Python 3.12 on
# manylinux x86_64, at the versions installed here:
#   bash benchmarks/gpu_wheels.sh
# then carry .whl/ to the GPU machine and run benchmarks/gpu_checks.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
version() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
packages=()
for name in monai hydra-core omegaconf nibabel; do packages+=("$name==$(version "$name")"); done
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${packages[@]}"
# antlr4's runtime (hydra's override parser) is published as source only: build its wheel here
python -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==$(version antlr4-python3-runtime)"
ls -1 .whl

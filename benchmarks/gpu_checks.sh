#!/usr/bin/env bash
# Every CUDA figure the open issues ask for, in one run on a lent GPU (device tool):
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
# 1. the seed-case table (issue 3): unet_large vs unet_small, batch 2, 1x26x150x320, 16-true
# 2. the estimator against real CUDA steps (issue 4): benchmarks/estimator_accuracy.py --device cuda
# 3. the CUDA context: what nvidia-smi shows beyond torch's reserved memory (estimate.cuda_context_mib)
set -euo pipefail
OUT="${1:-${OUT:-gpu_checks}}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.csv"
python - <<'PY' | tee "$OUT/cuda_context.txt"
import subprocess, os, torch
x = torch.ones(1, device="cuda")  # creates the context, loads kernels lazily
torch.cuda.synchronize()
used = subprocess.run(
    ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
    capture_output=True, text=True).stdout
mine = [int(line.split(",")[1]) for line in used.splitlines() if line.split(",")[0].strip() == str(os.getpid())]
reserved = torch.cuda.memory_reserved() / 2**20
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}: nvidia-smi {mine} MiB for this process, "
      f"reserved {reserved:.0f} MiB -> CUDA context ~{(mine[0] - reserved) if mine else float('nan'):.0f} MiB")
PY
python benchmarks/gpu_memory_table.py | tee "$OUT/gpu_memory_table.md"
python benchmarks/estimator_accuracy.py --device cuda | tee "$OUT/estimator_accuracy_cuda.md"

#!/usr/bin/env bash
# Every CUDA check and figure in one run of about 8 minutes (14 at most), on a GPU machine with torch and
# lightning (the rest installed from .whl/, see benchmarks/gpu_wheels.sh):
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
# Writes 7 files to OUT_DIR: gpu.txt (device, torch, CUDA context), steps.txt (exit code and
# seconds of each step), pytest_cuda.txt (pytest -m cuda), seed_table.md (unet_large vs
# unet_small at the seed case), estimator_cuda.md (estimator vs real CUDA steps), levers_cuda.md
# (the levers measured on CUDA) and train_unet_small.txt (the used-by command for 2 minutes).
# Without CUDA it runs what a CPU can (the wheel install, pytest -m cuda collecting and skipping).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-gpu_checks}}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/volseg-site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/volseg-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/src:$PWD:${PYTHONPATH:-}" PROJECT_ROOT="$PWD" PYTHONUNBUFFERED=1
has_cuda=$(python3 -c "import torch; print(int(torch.cuda.is_available()))")

step() {  # step NAME TIMEOUT_S COMMAND...: output to $OUT/NAME, exit code and time to steps.txt
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name" 2>&1
  echo "$name: exit $? in $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
}

python3 - >"$OUT/gpu.txt" 2>&1 <<'PY'
import datetime, os, subprocess, torch
print(datetime.date.today(), "torch", torch.__version__, "CUDA", torch.version.cuda)
if torch.cuda.is_available():
    x = torch.ones(1, device="cuda")  # creates the context; kernels load lazily
    torch.cuda.synchronize()
    print(torch.cuda.get_device_name(), "bf16:", torch.cuda.is_bf16_supported())
    used = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True).stdout
    mine = [int(l.split(",")[1]) for l in used.splitlines() if l.split(",")[0].strip() == str(os.getpid())]
    reserved = torch.cuda.memory_reserved() / 2**20
    print(f"nvidia-smi {mine} MiB for this process, reserved {reserved:.0f} MiB -> CUDA context "
          f"~{(mine[0] - reserved) if mine else float('nan'):.0f} MiB (estimate.cuda_context_mib)")
else:
    print("no CUDA device: GPU steps skipped")
PY
step pytest_cuda.txt 300 python3 -m pytest -q -m cuda -p no:cacheprovider tests/cuda
if [ "$has_cuda" = 1 ]; then
  step seed_table.md 45 python3 benchmarks/gpu_memory_table.py
  step estimator_cuda.md 300 python3 benchmarks/estimator_accuracy.py --device cuda --grid tuned
  step levers_cuda.md 60 python3 benchmarks/levers.py --device cuda --steps 2
  step train_unet_small.txt 90 python3 train.py model=unet_small trainer.precision=16-mixed \
    trainer.max_time=00:00:01:15 hydra.run.dir=/tmp/volseg-gpu-run
fi
cat "$OUT/gpu.txt"

# training speed of python train.py at the seed config with its own loader (step time, data wait,
# MFU); the figures as data under benchmarks/results/cuda/
if [ "$has_cuda" = 1 ]; then
  step train_speed_seed.txt 240 python3 benchmarks/gpu_train_speed.py --steps 60 \
    --out "$OUT/train_speed_seed.json"
else
  step train_speed_dry_run.txt 240 python3 benchmarks/gpu_train_speed.py --dry-run
fi

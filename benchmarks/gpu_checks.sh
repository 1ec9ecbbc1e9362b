#!/usr/bin/env bash
# Every CUDA check and figure in one run of at most 9 minutes on an NVIDIA H200, on a GPU machine
# with torch and lightning (monai, hydra-core, omegaconf, antlr4 and nibabel installed from .whl/,
# see benchmarks/gpu_wheels.sh):
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
#   bash benchmarks/gpu_checks.sh --dry-run [OUT_DIR]   # on a CPU: the same pipeline at tiny sizes
# Writes benchmarks/results/cuda/<date>_<gpu>.json (commit it: see benchmarks/cuda_results.py for
# its runs, in the order they start: expandable segments off/on on the reference config, whole
# runs (validation and prediction peaks), the levers toward a 4x cut, off/on for the other main
# runs, the held-out grids, the rest of the recorded grid) and, in OUT_DIR: gpu.txt (device,
# torch, CUDA context), steps.txt (exit code and seconds of each step), cuda_results.txt (the runs
# as they finish), pytest_cuda.txt (pytest -m cuda; its JUnit XML, <date>_<gpu>_pytest_cuda.xml,
# is written beside the results file) and a copy of the results file. Without CUDA
# it runs what a CPU can (wheel install, the results pipeline with --dry-run, pytest -m cuda
# collecting and skipping).
#
# Time budget (s, H200 machine with 16 cores; each step's limit is also cut to what is left of
# the 530 s the whole script may take, and a step with under 10 s left is skipped):
#   wheels ~10, gpu.txt ~10, cuda_results <= 360 (no run starts after 290 s, runs still going at
#   340 s are stopped), pytest -m cuda <= 90, train speed <= 60, cpu_bf16_conv <= 20, selective
#   checkpointing <= 120 (in what is left)
set -uo pipefail
cd "$(dirname "$0")/.."
dry_run=0
if [ "${1:-}" = "--dry-run" ]; then dry_run=1; shift; fi
OUT="${1:-${OUT:-gpu_checks}}"
mkdir -p "$OUT"
deadline=$((SECONDS + 530))
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/volseg-site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/volseg-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/src:$PWD:${PYTHONPATH:-}" PROJECT_ROOT="$PWD" PYTHONUNBUFFERED=1
has_cuda=$(python3 -c "import torch; print(int(torch.cuda.is_available()))")
if [ "$has_cuda" = 0 ]; then dry_run=1; fi

step() {  # step NAME TIMEOUT_S COMMAND...: output to $OUT/NAME, exit code and time to steps.txt
  local name=$1 limit=$2; shift 2
  local left=$((deadline - SECONDS))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt 10 ]; then
    echo "$name: skipped, ${left} s left of the script's 530" | tee -a "$OUT/steps.txt"
    return
  fi
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name" 2>&1
  echo "$name: exit $? in $((SECONDS - start)) s (limit $limit s)" | tee -a "$OUT/steps.txt"
}

python3 - >"$OUT/gpu.txt" 2>&1 <<'PY'
import datetime, os, subprocess, torch
print(datetime.date.today(), "torch", torch.__version__, "CUDA", torch.version.cuda,
      "cuDNN", torch.backends.cudnn.version())
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
          f"~{(mine[0] - reserved) if mine else float('nan'):.0f} MiB (memory.cuda_context_mib)")
else:
    print("no CUDA device: GPU steps run as a dry run on the CPU")
PY

# 1. the results file (python -m benchmarks cuda_results): 3 train.py/predict.py processes in flight,
#    training one at a time under a lock (~10 s of process start overlaps another's training);
#    the most wanted runs first; no run starts after 290 s, runs still going at 340 s are stopped,
#    and whatever did not finish is listed as not_run
if [ "$dry_run" = 1 ]; then
  step cuda_results.txt 300 python3 -m benchmarks cuda_results --dry-run --budget-s 240 \
    --deadline-s 290 --out "$OUT"
else
  step cuda_results.txt 360 python3 -m benchmarks cuda_results --budget-s 290 --deadline-s 340
  cp benchmarks/results/cuda/"$(date +%F)"_*.json "$OUT"/ 2>/dev/null
fi
# 2. the CUDA tests (tests/cuda/: monitor keys, snapshot, offload, checkpointing, placement, host
#    stitching, precisions, the 16 GiB planner check); the estimator-vs-train.py cases are left
#    to step 1, which measures the same runs into the results file. -m cuda replaces
#    pyproject.toml's -m 'not slow'. The JUnit XML goes beside step 1's results file
#    (<date>_<gpu>_pytest_cuda.xml; commit it with the file) and into OUT
results_json=$(ls -t "$OUT"/"$(date +%F)"_*.json 2>/dev/null | head -n 1)
if [ -z "$results_json" ]; then
  junit="$OUT/pytest_cuda.xml"  # step 1 wrote no results file
elif [ "$dry_run" = 1 ]; then
  junit="${results_json%.json}_pytest_cuda.xml"
else
  junit="benchmarks/results/cuda/$(basename "${results_json%.json}")_pytest_cuda.xml"
fi
step pytest_cuda.txt 90 python3 -m pytest -q -m cuda -p no:cacheprovider tests/cuda \
  -k "not estimator_within_ten_percent" --junitxml="$junit"
case "$junit" in "$OUT"/*) ;; *) if [ -f "$junit" ]; then cp "$junit" "$OUT"/; fi ;; esac

# ---- further GPU checks go below this line, each as one `step` with its own timeout ----

# training speed of python train.py at the reference config with its own loader (step time, data
# wait, MFU); the figures as data under benchmarks/results/cuda/
if [ "$has_cuda" = 1 ]; then
  step train_speed_seed.txt 60 python3 -m benchmarks gpu_train_speed --steps 60 \
    --out "$OUT/train_speed_seed.json"
else
  step train_speed_dry_run.txt 240 python3 -m benchmarks gpu_train_speed --dry-run
fi

# each lever's predicted step-time factor (estimate_memory.py's table: FLOPs) against the measured
# one, the CPU benchmark's rows on the GPU (unet_small and MONAI's BasicUNet, float32)
if [ "$has_cuda" = 1 ]; then
  step lever_time_factors.txt 120 python3 -m benchmarks lever_time_factors --device cuda \
    --json-out "$OUT/lever_time_factors.json"
fi

# the host CPU's bf16 convolutions (another CPU model than the development machines'): whether
# its oneDNN kernels get the weight gradient wrong at depth 2 (docs/benchmarks.md); a few seconds
step cpu_bf16_conv.txt 20 python3 -m benchmarks cpu_bf16_conv

# selective activation checkpointing beside none and all on unet_large at the reference input
# (batch 2 of 1x26x150x320, 16-mixed): step growth, step time, the estimate; after the checks
# above, in what is left of the 530 s (3 train.py runs of 3 steps, ~90 s on an H200)
if [ "$has_cuda" = 1 ]; then
  step selective_checkpointing.txt 120 python3 -m benchmarks selective_checkpointing \
    --device cuda --json-out "$OUT/selective_checkpointing.json"
fi

cat "$OUT/gpu.txt"
echo "gpu_checks.sh: $SECONDS s in all" | tee -a "$OUT/steps.txt"

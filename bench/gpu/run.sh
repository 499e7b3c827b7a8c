#!/usr/bin/env bash
# The GPU check, for whenever a GPU machine is lent: build the package with its CUDA module,
# verify and time the micro-benchmark kernels, run the GPU tests, profile a 1B-scale block
# (gpt3-1.3b: h 2048, 16 heads, seq 2048, bf16), and calibrate the catalog from the results.
# Designed to finish in under five minutes on an H100/H200; offline (no downloads: it builds
# with the machine's own scikit-build-core, pybind11, CMake and torch).
#
#   bash bench/gpu/run.sh [RESULTS_DIR]      # default: $OUT, else bench/gpu/results
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
RES="${1:-${OUT:-bench/gpu/results}}"
mkdir -p "$RES"
PY="${PYTHON:-python3}"
GPU_TYPE="${ESPRESSO_GPU:-}"      # catalog type; default: matched from the device name
ARCH="${CUDA_ARCH:-90}"           # 90: H100/H200; 80: A100
log() { echo "== $(date +%H:%M:%S) $*" | tee -a "$RES/log.txt"; }

log "build (CUDA architectures $ARCH)"
t0=$SECONDS
"$PY" -m pip install --no-build-isolation --no-deps -q \
  -Ccmake.define.ESPRESSO_CUDA=ON -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -Cbuild-dir=build/gpu . 2>&1 | tail -5 | tee -a "$RES/log.txt"
log "built in $((SECONDS - t0)) s"
cd "$RES"   # from here on import the installed package, not the source tree
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
  > nvidia-smi.csv 2>&1 || true

log "bench-gpu: verify, then time, each kernel"
gpu_flag=(); [ -n "$GPU_TYPE" ] && gpu_flag=(--gpu "$GPU_TYPE")
timeout 180 "$PY" -m espresso.cli bench-gpu "${gpu_flag[@]}" --json bench-gpu.json \
  | tee bench-gpu.txt

if ! "$PY" -c 'import json,sys; sys.exit(0 if json.load(open("bench-gpu.json"))["device"]["available"] else 1)'; then
  log "no usable GPU here: stopping after the build and the bench-gpu check"
  exit 0
fi

log "GPU tests"
timeout 120 "$PY" -m pytest -q -p no:cacheprovider "$OLDPWD/tests/test_gpu.py" 2>&1 \
  | tail -5 | tee -a log.txt || true

TYPE="${GPU_TYPE:-$("$PY" -c 'import json; print(json.load(open("bench-gpu.json")).get("catalog_gpu") or "H200")')}"
log "profile gpt3-1.3b on $TYPE: micro-batch 4 x seq 2048, bf16"
timeout 180 "$PY" -m espresso.cli profile --model gpt3-1.3b --gpu "$TYPE" --seq-len 2048 \
  --micro-batch 4 --repeats 20 --out profile-gpt3-1.3b.json | tee profile.txt

log "calibrate the catalog"
"$PY" -m espresso.cli calibrate --bench bench-gpu.json --gpu "$TYPE" \
  --out catalog-calibrated.yaml | tee calibrate.txt
"$PY" -m espresso.cli plan --model gpt3-1.3b --tokens 2e10 --deadline 7d --seq-len 2048 \
  --profile "$TYPE=profile-gpt3-1.3b.json" --no-compare --json plan-profiled.json \
  > plan-profiled.txt 2>&1 || true
log "done in $((SECONDS - t0)) s; results in $RES"

#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (an H200 for the targets of docs/BENCHMARKS.md), in one run of
# well under 8 minutes: builds heavykv with CUDA into build-gpu/, runs the CUDA tests (ctest -L
# cuda) and the cuda/ benchmarks, and writes the results into OUTDIR:
#   nvidia-smi.txt, gpu.csv        the GPU, driver and clocks (read only: nothing is changed)
#   build.log                      configure + build output
#   ctest-cuda.xml, ctest-cuda.log the CUDA tests (JUnit) and their output
#   bench-cuda.json, bench-cuda.log  heavykv_bench --benchmark_filter='^cuda/' (summary + console)
#   summary.txt                    what passed, what failed, seconds per phase
# Usage: scripts/gpu-check.sh OUTDIR        (HEAVYKV_JOBS, default 16: build parallelism)
# Never resets the GPU or changes its settings. Exits non-zero when a phase fails (the later
# phases still run where they can, so OUTDIR holds as much as possible).
set -uo pipefail
OUT=${1:?usage: scripts/gpu-check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
JOBS=${HEAVYKV_JOBS:-16}
BUILD=build-gpu
status=0
start=$(date +%s)
phase() { echo "$1: $2 ($(( $(date +%s) - start ))s)" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

if command -v nvidia-smi >/dev/null; then
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm,clocks.max.mem,power.limit \
    --format=csv > "$OUT/gpu.csv" 2>&1
  phase gpu "$(head -2 "$OUT/gpu.csv" | tail -1)"
else
  phase gpu "nvidia-smi not found"
fi

# Build dependencies: the Debian packages of scripts/install-deps.sh (it installs only what is
# missing, through apt-get), and the CUDA toolkit, which must already be there.
if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  phase deps "FAILED: no nvcc on PATH or in /usr/local/cuda/bin; install the CUDA toolkit"
  exit 1
fi
if ! bash scripts/install-deps.sh > "$OUT/deps.log" 2>&1; then
  phase deps "FAILED: scripts/install-deps.sh could not install the missing packages (is apt reachable?); see deps.log"
  exit 1
fi
phase deps ok

# The GPU tests and the benchmark tool only (the CPU suite is CI's job).
if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHEAVYKV_CUDA=ON > "$OUT/build.log" 2>&1 &&
   cmake --build "$BUILD" -j "$JOBS" --target heavykv_cuda heavykv_bench cuda_kernels_test \
     cuda_cuda_model_runner_test cuda_eviction_rule_test >> "$OUT/build.log" 2>&1; then
  phase build ok
else
  phase build "FAILED: see build.log"
  tail -40 "$OUT/build.log"
  exit 1
fi

if (cd "$BUILD" && timeout 180 ctest -L cuda --output-on-failure --timeout 120 \
      --output-junit "$OUT/ctest-cuda.xml") > "$OUT/ctest-cuda.log" 2>&1; then
  phase tests "ok ($(grep -c ' Passed' "$OUT/ctest-cuda.log") passed, $(grep -c 'Skipped' "$OUT/ctest-cuda.log") skipped)"
else
  status=1
  phase tests "FAILED: see ctest-cuda.log"
  grep -E "Failed|FAILED|Failure" "$OUT/ctest-cuda.log" | head -20
fi

export HEAVYKV_BENCH_DIR="${HEAVYKV_BENCH_DIR:-/tmp/heavykv-bench}"
if timeout 300 "$BUILD/bin/heavykv_bench" --benchmark_filter='^cuda/' \
     --summary_json="$OUT/bench-cuda.json" > "$OUT/bench-cuda.log" 2>&1; then
  phase bench ok
else
  status=1
  phase bench "FAILED or timed out: see bench-cuda.log"
fi
grep -E "ERROR OCCURRED" "$OUT/bench-cuda.log" | head -5
phase done "exit $status"
exit $status

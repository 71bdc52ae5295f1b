#!/usr/bin/env bash
# gpu3 session, run 5: gpu-check.sh (tests, cuda/ benchmarks with the three attention kernels side
# by side, the decode step with the new default "mma"), the decode step again with the previous
# default (HEAVYKV_CUDA_ATTENTION=stream) and with cuBLASLt candidates timed (HEAVYKV_CUDA_GEMM_TUNE=1,
# also the runner's parity tests), ncu of the attention kernels (mma with and without
# scores, stream without) and of one decode step per batch size.
# Usage, from the checkout root on the GPU machine (build-gpu3/bundle.tar.gz from
# scripts/gpu-bundle.sh): bash docs/gpu-run-2026-12-04/run5/run5.sh "$OUT"
set -uo pipefail
OUT=${1:?OUT}
B=build-gpu3
R=$OUT  # everything is written there as it happens, so a run cut short still returns it
rm -rf "$B/b"; mkdir -p "$B/b" "$R"
tar xzf "$B/bundle.tar.gz" -C "$B/b"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$R/extra-summary.txt"; }
bash "$B/b/gpu-check.sh" --prebuilt "$B/b" "$R/check" > "$R/check-console.txt" 2>&1
el "gpu-check exit $?"
LIBS=$PWD/$B/b/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [[ -d $d ]] && LIBS=$LIBS:$d; done
export LD_LIBRARY_PATH=$LIBS
export HEAVYKV_CUDA_BACKEND=$PWD/$B/b/lib/libheavykv_cuda.so
export HEAVYKV_BENCH_DIR=/tmp/heavykv-bench
BIN=$B/b/bin
HEAVYKV_CUDA_ATTENTION=stream timeout -k 5 60 "$BIN/heavykv_bench" --benchmark_filter='^cuda/decode' \
  --benchmark_color=false --summary_json="$R/bench-decode-stream.json" > "$R/bench-decode-stream.log" 2>&1
el "decode with stream exit $?"
HEAVYKV_CUDA_GEMM_TUNE=1 timeout -k 5 60 "$BIN/heavykv_bench" --benchmark_filter='^cuda/decode' \
  --benchmark_color=false --summary_json="$R/bench-decode-gemm-tune.json" > "$R/bench-decode-gemm-tune.log" 2>&1
el "decode with GEMM tuning exit $?"
HEAVYKV_CUDA_GEMM_TUNE=1 timeout -k 5 60 "$BIN/cuda_cuda_model_runner_test" > "$R/runner-test-gemm-tune.log" 2>&1
el "runner test with GEMM tuning exit $? ($(grep -E '^\[  (PASSED|FAILED) ' "$R/runner-test-gemm-tune.log" | tr '\n' ' '))"
NCU=/usr/local/cuda/bin/ncu
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats"
for ks in mma/noscores mma/scores stream/noscores; do
  k=${ks%/*}; s=${ks#*/}
  name=$([[ $k == mma ]] && echo AttentionMmaKernel || echo AttentionStreamKernel)
  echo "=== ncu $name, hd128/$s/$k" >> "$R/ncu-attention.txt"
  timeout -k 5 40 $NCU --clock-control none -k "regex:$name" -c 1 $S "$BIN/heavykv_bench" \
    --benchmark_filter="hd128/$s/$k/iter" --benchmark_color=false >> "$R/ncu-attention.txt" 2>&1
  el "ncu $k $s exit $?"
done
HEAVYKV_PROFILE_STEP=1 timeout -k 5 75 $NCU --clock-control none --profile-from-start off --csv \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum "$BIN/heavykv_bench" \
  --benchmark_filter='^cuda/decode' --benchmark_color=false > "$R/ncu-step.csv" 2>&1
el "ncu decode step exit $?"
el "done"

#!/usr/bin/env bash
# gpu3 session, run 5b (minutes after run 5, a fresh machine): the CUDA tests, the mma attention
# benchmarks and the decode step (+ ncu of one step) after two changes made from run 5's figures:
# the planner caps mma chunks at 1024 keys with scores, and RopeKvAppend takes one pair per thread.
# At most 7 files in OUT (the device tool returns 8).
set -uo pipefail
OUT=${1:?OUT}
B=build-gpu3
rm -rf "$B/b"; mkdir -p "$B/b"; tar xzf "$B/bundle.tar.gz" -C "$B/b"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/extra-summary.txt"; }
el "bundle: $(cat "$B/b/MANIFEST"); $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader)"
LIBS=$PWD/$B/b/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [[ -d $d ]] && LIBS=$LIBS:$d; done
export LD_LIBRARY_PATH=$LIBS
ldd "$B/b/bin/heavykv" 2>&1 | grep -q "GLIBCXX.*not found" && export LD_LIBRARY_PATH=$PWD/$B/b/lib/compat:$LD_LIBRARY_PATH
export HEAVYKV_CUDA_BACKEND=$PWD/$B/b/lib/libheavykv_cuda.so HEAVYKV_BENCH_DIR=/tmp/heavykv-bench
src=$(cat "$B/b/SOURCE_DIR")
[[ -e $src/models/stories260K.bin ]] || { mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; }
BIN=$B/b/bin
for t in cuda_kernels_test cuda_cuda_model_runner_test; do
  echo "=== $t" >> "$OUT/tests.log"
  timeout -k 5 60 "$BIN/$t" >> "$OUT/tests.log" 2>&1
  el "$t exit $? ($(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests.log" | tail -1))"
done
timeout -k 5 40 "$BIN/heavykv_bench" --benchmark_filter='^cuda/(bandwidth|attention/.*/mma/)' \
  --benchmark_color=false --summary_json="$OUT/bench-attention.json" > "$OUT/bench-attention.log" 2>&1
el "attention (mma) exit $?"
timeout -k 5 60 "$BIN/heavykv_bench" --benchmark_filter='^cuda/decode' --benchmark_color=false \
  --summary_json="$OUT/bench-decode.json" > "$OUT/bench-decode.log" 2>&1
el "decode exit $?"
HEAVYKV_PROFILE_STEP=1 timeout -k 5 60 /usr/local/cuda/bin/ncu --clock-control none \
  --profile-from-start off --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum \
  "$BIN/heavykv_bench" --benchmark_filter='^cuda/decode' --benchmark_color=false \
  > "$OUT/ncu-step.csv" 2>&1
el "ncu decode step exit $?"

#!/usr/bin/env bash
# gpu2 session, run 3: gpu-check.sh (tests, cuda/ benchmarks with both attention kernels), the
# llama3-1b decode step with the old kernel, ncu of both attention kernels and of one decode step.
set -uo pipefail
OUT=${1:?OUT}
B=build-gpu2
R=/tmp/r3
rm -rf "$B/b" "$R"; mkdir -p "$B/b" "$R"
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
HEAVYKV_CUDA_ATTENTION=two-pass timeout -k 5 100 "$BIN/heavykv_bench" --benchmark_filter='^cuda/decode' \
  --benchmark_color=false --summary_json="$R/bench-decode-two-pass.json" > "$R/bench-decode-two-pass.log" 2>&1
el "decode with two-pass exit $?"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); el "ncu: $NCU"
SECTIONS="--section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis"
for k in stream two-pass; do
  name=$([[ $k == stream ]] && echo AttentionStreamKernel || echo AttentionSplitKernel)
  for s in noscores scores; do
    echo "=== ncu $name, hd128/$s/$k" >> "$R/ncu-attention.txt"
    timeout -k 5 60 "$NCU" --clock-control none -k "regex:$name" -c 1 $SECTIONS "$BIN/heavykv_bench" \
      --benchmark_filter="hd128/$s/$k\$" --benchmark_color=false >> "$R/ncu-attention.txt" 2>&1
    el "ncu $k $s exit $?"
  done
done
HEAVYKV_PROFILE_STEP=1 timeout -k 5 120 "$NCU" --clock-control none --profile-from-start off --csv \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum "$BIN/heavykv_bench" \
  --benchmark_filter='^cuda/decode' --benchmark_color=false > "$R/ncu-step.csv" 2>&1
el "ncu decode step exit $?"
cp "$R/check/summary.txt" "$OUT/summary.txt"
cp "$R/check/bench.log" "$OUT/bench.log" 2>/dev/null
cp "$R/ncu-attention.txt" "$OUT/ncu-attention.txt" 2>/dev/null
cp "$R/extra-summary.txt" "$OUT/extra-summary.txt"
tar czf "$OUT/run3.tar.gz" -C "$R" .
el "done"

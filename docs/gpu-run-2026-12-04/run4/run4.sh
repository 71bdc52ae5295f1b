#!/usr/bin/env bash
set -uo pipefail
OUT=${1:?OUT}
B=build-gpu2
[[ -x $B/b/bin/heavykv_bench ]] || { rm -rf $B/b; mkdir -p $B/b; tar xzf $B/bundle.tar.gz -C $B/b; }
LIBS=$PWD/$B/b/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [[ -d $d ]] && LIBS=$LIBS:$d; done
export LD_LIBRARY_PATH=$LIBS HEAVYKV_BENCH_DIR=/tmp/heavykv-bench
BIN=$B/b/bin
NCU=/usr/local/cuda/bin/ncu
S="--section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats"
for k in stream two-pass; do
  name=$([[ $k == stream ]] && echo AttentionStreamKernel || echo AttentionSplitKernel)
  for s in noscores scores; do
    echo "=== ncu $name, hd128/$s/$k" >> "$OUT/ncu-attention.txt"
    timeout -k 5 60 $NCU --clock-control none -k "regex:$name" -c 1 $S "$BIN/heavykv_bench" \
      --benchmark_filter="hd128/$s/$k/iter" --benchmark_color=false >> "$OUT/ncu-attention.txt" 2>&1
    echo "exit $?" >> "$OUT/ncu-attention.txt"
  done
done

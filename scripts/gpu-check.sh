#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (an H200 for the targets of docs/BENCHMARKS.md), in one run of
# typically 3 to 5 minutes (each phase has its own timeout): runs the CUDA tests, the cuda/
# benchmarks and greedy generations on the GPU, and writes the results into OUTDIR (8 files, so that a tool returning at most 8 brings all):
#   gpu.txt          nvidia-smi, the GPU's name/driver/clocks (read only: nothing is changed), the
#                    CUDA libraries the loader finds, and ldd of each binary
#   checks.log       the five CUDA test binaries' output (quant_gemv and gpu_weight_plan: issue 32's
#                    quantized weights, never run on a GPU before), compute-sanitizer's memcheck of
#                    the tests that failed (where it is installed), then the generation's stderr
#   tests-xml.tar    their JUnit XML (cuda_kernels_test.xml, ...)
#   bench.json, bench-decode.json, bench.log
#                    heavykv_bench --summary_json of the cuda/ benchmarks (kernels + capacity + the
#                    quantized GEMVs of one llama3.2-1b decode step, then the decode steps: llama3-1b,
#                    which writes a 5 GB model first, and a random Q4_K_M llama3.2-1b GGUF, ~0.8 GB,
#                    with --gpu-weights bf16 and quantized) and the console
#   gen-cuda.txt     `heavykv run --device cuda` greedy text of the bundled model (256 tokens),
#                    compared with the CPU's reference tests/data/stories260K.greedy.txt
#   summary.txt      what passed, what failed, seconds per phase
#
# Usage:
#   scripts/gpu-check.sh OUTDIR
#       builds build-gpu/ here with CUDA (installs missing Debian packages through
#       scripts/install-deps.sh, so it needs apt; HEAVYKV_JOBS, default 16: build parallelism)
#       and adds deps.log and build.log to OUTDIR.
#   scripts/gpu-check.sh --prebuilt DIR OUTDIR
#       uses the bundle DIR made by scripts/gpu-bundle.sh on another machine (DIR/bin, DIR/lib
#       with the non-CUDA shared libraries, DIR/SOURCE_DIR): for a GPU machine with the CUDA
#       toolkit's libraries but no network and none of our Debian packages. The binaries look for
#       models/ under the source directory they were built in (DIR/SOURCE_DIR); when that path
#       does not exist it is made a symbolic link to this checkout (needs write access to its
#       parent: root on a throwaway machine).
# Never resets the GPU or changes its settings. Exits non-zero when a phase fails (the later
# phases still run where they can, so OUTDIR holds as much as possible).
set -uo pipefail
PREBUILT=
if [[ "${1:-}" == --prebuilt ]]; then
  PREBUILT=${2:?usage: scripts/gpu-check.sh --prebuilt DIR OUTDIR}
  shift 2
fi
OUT=${1:?usage: scripts/gpu-check.sh [--prebuilt DIR] OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
[[ -n "$PREBUILT" ]] && PREBUILT=$(cd "$PREBUILT" && pwd)
cd "$(dirname "$0")/.."
# A bundle carries its own copy of this script; run from there, the checkout is the current one.
[[ -f models/stories260K.bin ]] || cd "$OLDPWD"
ROOT=$(pwd)
status=0
start=$(date +%s)
phase() { echo "$1: $2 ($(( $(date +%s) - start ))s)" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

{
  echo "== nvidia-smi"; nvidia-smi 2>&1
  echo "== GPU"
  query=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,clocks.mem
  nvidia-smi --format=csv --query-gpu=$query,clocks.max.mem,power.limit 2>&1
  echo "== CUDA libraries the loader knows"; ldconfig -p 2>/dev/null | grep -E 'cublas|cudart'
} > "$OUT/gpu.txt"
if command -v nvidia-smi >/dev/null; then
  phase gpu "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader |
    head -1)"
else
  phase gpu "nvidia-smi not found"
fi

if [[ -n "$PREBUILT" ]]; then
  BIN=$PREBUILT/bin
  # The bundle's Debian libraries first, then the toolkit's (cudart, cuBLASLt) where it keeps them.
  LIBS=$PREBUILT/lib
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -d $d ]] && LIBS=$LIBS:$d
  done
  export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  if ldd "$BIN/heavykv" 2>&1 | grep -q "GLIBCXX.*not found"; then  # an older libstdc++ here
    export LD_LIBRARY_PATH=$PREBUILT/lib/compat:$LD_LIBRARY_PATH
  fi
  export HEAVYKV_CUDA_BACKEND=$PREBUILT/lib/libheavykv_cuda.so
  src=$(cat "$PREBUILT/SOURCE_DIR")
  if [[ ! -e "$src/models/stories260K.bin" ]]; then
    if [[ ! -e "$src" ]] && mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src"; then
      echo "linked $src -> $ROOT (the source directory compiled into the binaries)" >> "$OUT/gpu.txt"
    else
      phase bundle "FAILED: $src/models is missing and $src cannot be made a link to $ROOT"
      status=1
    fi
  fi
  {
    echo "== bundle $PREBUILT: $(cat "$PREBUILT/MANIFEST" 2>/dev/null)"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    for f in "$BIN"/* "$HEAVYKV_CUDA_BACKEND"; do echo "-- ldd $f"; ldd "$f" 2>&1; done
  } >> "$OUT/gpu.txt"
  missing=$(grep -c '=> not found' "$OUT/gpu.txt")
  phase bundle "$( ((missing)) && echo "WARNING: $missing libraries not found (gpu.txt)" || echo ok)"
else
  BIN=build-gpu/bin
  # Build dependencies: the Debian packages of scripts/install-deps.sh (it installs only what is
  # missing, through apt-get), and the CUDA toolkit, which must already be there.
  if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
    phase deps "FAILED: no nvcc on PATH or in /usr/local/cuda/bin; install the CUDA toolkit"
    exit 1
  fi
  if ! bash scripts/install-deps.sh > "$OUT/deps.log" 2>&1; then
    phase deps "FAILED: scripts/install-deps.sh could not install the missing packages$(
      ) (is apt reachable?); see deps.log"
    exit 1
  fi
  phase deps ok
  if cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHEAVYKV_CUDA=ON > "$OUT/build.log" 2>&1 &&
     cmake --build build-gpu -j "${HEAVYKV_JOBS:-16}" --target heavykv heavykv_cuda heavykv_bench \
       cuda_kernels_test cuda_cuda_model_runner_test cuda_eviction_rule_test cuda_quant_gemv_test \
       cuda_gpu_weight_plan_test >> "$OUT/build.log" 2>&1; then
    phase build ok
  else
    phase build "FAILED: see build.log"
    tail -40 "$OUT/build.log"
    exit 1
  fi
fi

# The CUDA tests, each binary directly (a bundle has no ctest files); 150 s each at most.
mkdir -p "$OUT/xml"
: > "$OUT/checks.log"
for t in cuda_kernels_test cuda_cuda_model_runner_test cuda_eviction_rule_test \
  cuda_quant_gemv_test cuda_gpu_weight_plan_test; do
  echo "=== $t" >> "$OUT/checks.log"
  timeout -k 5 150 "$BIN/$t" --gtest_output="xml:$OUT/xml/$t.xml" >> "$OUT/checks.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    phase "test $t" "ok"
  else
    status=1
    phase "test $t" "FAILED (exit $rc$( ((rc == 124)) && echo ': timed out'))"
  fi
done
# A failed or crashed binary: its failed tests (or the one it died in) again under
# compute-sanitizer's memcheck, 90 s at most, appended to checks.log.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
for t in cuda_kernels_test cuda_cuda_model_runner_test cuda_quant_gemv_test; do
  [[ -n "$sanitizer" ]] || break
  s=$(awk -v h="=== $t" '$0 == h {p = 1; next} /^===/ {p = 0} p' "$OUT/checks.log")
  f=$(grep -E '^\[  FAILED  \] [A-Za-z].* \(' <<<"$s" | awk '{print $4}' | paste -sd: -)
  grep -q '^\[==========\] .* ran' <<<"$s" ||
    f=$(grep '^\[ RUN      \]' <<<"$s" | tail -1 | awk '{print $4}')
  [[ -n "$f" ]] || continue
  { echo "=== compute-sanitizer $t --gtest_filter=$f"
    timeout -k 5 90 "$sanitizer" --tool memcheck --print-limit 30 "$BIN/$t" --gtest_filter="$f" \
      2>&1 | tail -150
  } >> "$OUT/checks.log"
  phase sanitizer "$t: see checks.log"
done
(cd "$OUT/xml" && tar cf "$OUT/tests-xml.tar" ./*.xml 2>/dev/null) && rm -rf "$OUT/xml"
# Per binary: gtest's closing counts, then the names of the failed tests.
awk '/^=== /{name=$2} /^\[  (PASSED  |SKIPPED |FAILED  )\] [0-9]+ test/{print "  " name ": " $0}
     /^\[  FAILED  \] [A-Za-z].*, where|^\[  FAILED  \] [A-Za-z][^ ]*$/{print "  " name ": " $0}' \
  "$OUT/checks.log" | tee -a "$OUT/summary.txt"

# The benchmarks, in two runs so that a slow llama3-1b setup cannot cost the kernel figures.
export HEAVYKV_BENCH_DIR="${HEAVYKV_BENCH_DIR:-/tmp/heavykv-bench}"
: > "$OUT/bench.log"
bench() {  # NAME FILTER TIMEOUT
  echo "=== $2" >> "$OUT/bench.log"
  if timeout -k 5 "$3" "$BIN/heavykv_bench" --benchmark_filter="$2" --benchmark_color=false \
       --summary_json="$OUT/$1.json" >> "$OUT/bench.log" 2>&1; then
    phase "bench $2" ok
  else
    status=1
    phase "bench $2" "FAILED or timed out: see bench.log"
  fi
}
bench bench '^cuda/(bandwidth|attention|capacity|quant_gemv)' 150
bench bench-decode '^cuda/decode' 240
sed 's/\x1b\[[0-9;]*m//g' "$OUT/bench.log" | grep -E "ERROR OCCURRED" | tr -s ' ' | head -8 |
  tee -a "$OUT/summary.txt"

# Greedy generation on the GPU: bf16 weights and K/V, so it may leave the fp32 CPU reference
# after a near-tie; the summary gives the length of the common prefix.
echo "=== heavykv run --device cuda" >> "$OUT/checks.log"
ref=tests/data/stories260K.greedy.txt
if timeout -k 5 60 "$BIN/heavykv" run --model models/stories260K.bin --tokenizer models/tok512.bin \
     --temperature 0 --steps 256 --device cuda > "$OUT/gen-cuda.txt" 2>> "$OUT/checks.log"; then
  if cmp -s "$OUT/gen-cuda.txt" "$ref"; then
    same=identical
  else
    same="differs from byte $(cmp "$OUT/gen-cuda.txt" "$ref" 2>&1 | grep -o 'byte [0-9]*' | cut -d' ' -f2)"
  fi
  phase generate "ok; vs the CPU reference ($(wc -c < "$ref") bytes): $same"
else
  status=1
  phase generate "FAILED: see checks.log"
fi
# --gpu-weights quantized end to end (issue 32): greedy ids of a Q4_K_M fixture on the GPU with the
# file's blocks on the device, against the CPU's; the summary gives the common prefix (near-ties
# of a random model may part them late; cuda_model_runner_test holds the bounds).
echo "=== heavykv run --device cuda --gpu-weights quantized (rl256-q4_k_m.gguf)" >> "$OUT/checks.log"
q=tests/data/gguf/rl256-q4_k_m.gguf
qargs=(--model "$q" --prompt "Once upon a time" --temperature 0 --steps 48 --json)
ids() { grep -o '"token_ids":\[[^]]*\]' | tr -d '"token_ids:[]' | tr ',' ' '; }
if cpu_ids=$(timeout -k 5 60 "$BIN/heavykv" run "${qargs[@]}" 2>> "$OUT/checks.log" | ids) &&
   [[ -n "$cpu_ids" ]] &&
   gpu_ids=$(timeout -k 5 60 "$BIN/heavykv" run "${qargs[@]}" --device cuda --gpu-weights quantized \
     2>> "$OUT/checks.log" | ids) && [[ -n "$gpu_ids" ]]; then
  echo "cpu: $cpu_ids" >> "$OUT/checks.log"
  echo "gpu: $gpu_ids" >> "$OUT/checks.log"
  read -ra a <<<"$cpu_ids"
  read -ra b <<<"$gpu_ids"
  n=0
  while ((n < ${#a[@]} && n < ${#b[@]})) && [[ "${a[n]}" == "${b[n]}" ]]; do n=$((n + 1)); done
  phase "generate quantized" "ok; $n of ${#a[@]} ids as the CPU's"
else
  status=1
  phase "generate quantized" "FAILED: see checks.log"
fi
phase done "exit $status"
exit $status

#!/usr/bin/env bash
# The sanitizer and fuzzing part of CI, run by scripts/test.sh after the normal tests.
#  1. Builds heavykv with clang, ASan + UBSan (HEAVYKV_SANITIZE=address,undefined; undefined
#     behaviour aborts), RelWithDebInfo, CUDA off, plus the libFuzzer targets (HEAVYKV_FUZZ=ON),
#     into build-asan/.
#  2. Runs the unit and end-to-end tests there (ctest), servers spawned by the tests included:
#     every sanitizer report, from any process, lands in build-asan/sanitizer-logs and fails the
#     run.
#  3. Runs each fuzz target in tests/fuzz for a bounded number of inputs, starting from its seed
#     corpus in tests/fuzz/corpus/<target>/; a crash fails the run (docs/FUZZING.md).
# HEAVYKV_SKIP_SANITIZERS=1 skips all of it (local runs); HEAVYKV_ASAN_BUILD_DIR (build-asan),
# HEAVYKV_JOBS (2) and HEAVYKV_FUZZ_RUNS (inputs per fuzz target; default below) adjust it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${HEAVYKV_SKIP_SANITIZERS:-0}" == 1 ]]; then
  echo "test-sanitizers: skipped (HEAVYKV_SKIP_SANITIZERS=1)"
  exit 0
fi
bash scripts/install-deps.sh
BUILD_DIR="${HEAVYKV_ASAN_BUILD_DIR:-build-asan}"
JOBS="${HEAVYKV_JOBS:-2}"
SUPP="$PWD/tests/sanitizers"
phase_start=$SECONDS
phase() {  # prints how long the phase that just ended took
  echo "test-sanitizers: $1 took $((SECONDS - phase_start)) s"
  phase_start=$SECONDS
}

# RelWithDebInfo, not Debug: measured on 2 cores, Debug built in 141 s but its tests took 338 s;
# RelWithDebInfo built in 234 s and its tests took 70 s. Clang, so one build serves the fuzzers.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHEAVYKV_SANITIZE=address,undefined -DHEAVYKV_FUZZ=ON \
  -DHEAVYKV_CUDA=OFF -DHEAVYKV_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
phase "build"

# halt_on_error: the first report ends the process. Leak checking (LSan) stays on. The
# suppression files in tests/sanitizers say, entry by entry, why each is there.
common="print_stacktrace=1:halt_on_error=1:symbolize=1"
export ASAN_OPTIONS="$common:detect_leaks=1:check_initialization_order=1:strict_init_order=1"
export ASAN_OPTIONS="$ASAN_OPTIONS:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="$common:suppressions=$SUPP/ubsan.supp"
export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"

# The tests spawn `heavykv` servers and CLIs and do not always read their exit status (a server
# killed at the end of a test never reaches its leak check, one that exits may report after the
# test has its answer), so every report also goes to a file per process, checked below.
LOG_DIR="$PWD/$BUILD_DIR/sanitizer-logs"
rm -rf "$LOG_DIR" && mkdir -p "$LOG_DIR"
# Not run under the sanitizers: deploy_monitoring (a promtool lint of deploy/, runs no heavykv
# binary) and deploy_dockerfile (checks the shared libraries of the binary the image ships, the
# Release g++ one; this one links libomp and the sanitizer runtimes on purpose).
EXCLUDE='^(deploy_monitoring|deploy_dockerfile)$'
(
  cd "$BUILD_DIR"
  ASAN_OPTIONS="$ASAN_OPTIONS:log_path=$LOG_DIR/asan" \
  UBSAN_OPTIONS="$UBSAN_OPTIONS:log_path=$LOG_DIR/ubsan" \
    ctest -j "$JOBS" --output-on-failure --timeout 900 -E "$EXCLUDE"
)
if compgen -G "$LOG_DIR/*" >/dev/null; then
  echo "test-sanitizers: sanitizer reports from processes the tests started:" >&2
  cat "$LOG_DIR"/* >&2
  exit 1
fi
phase "sanitized tests"

# libFuzzer: new inputs go to a scratch corpus in the build dir (the committed one stays as it is),
# crash reproducers to $BUILD_DIR/fuzz-artifacts/. A fixed seed keeps CI reproducible.
# Inputs per target, sized so that each runs for 20-60 s on one CI core (the loaders write a file
# per input; the request checks run in memory).
default_runs() {
  case "$1" in
    model_loader_fuzzer | tokenizer_fuzzer | bpe_tokenizer_fuzzer) echo 150000 ;;
    gguf_fuzzer) echo 20000 ;;  # writes and reopens each accepted file: ~250 inputs/s
    chat_template_fuzzer) echo 100000 ;;  # parses and renders twice: ~2-3k inputs/s
    http_request_fuzzer) echo 60000 ;;  # a loopback connection per input: ~3k inputs/s
    grammar_compile_fuzzer) echo 40000 ;;  # compiles twice, steps an automaton: ~1k inputs/s
    chat_output_fuzzer) echo 150000 ;;  # parses whole and streamed, two parsers: ~6k inputs/s
    *) echo 1000000 ;;
  esac
}
for corpus in tests/fuzz/corpus/*/; do
  target="$(basename "$corpus")"
  FUZZ_RUNS="${HEAVYKV_FUZZ_RUNS:-$(default_runs "$target")}"
  scratch="$BUILD_DIR/fuzz-corpus/$target"
  artifacts="$BUILD_DIR/fuzz-artifacts/$target/"
  mkdir -p "$scratch" "$artifacts"
  echo "test-sanitizers: fuzzing $target ($FUZZ_RUNS inputs)"
  log="$BUILD_DIR/fuzz-artifacts/$target.log"
  if ! "$BUILD_DIR/bin/$target" -runs="$FUZZ_RUNS" -seed=1 -timeout=30 -rss_limit_mb=4096 \
      -artifact_prefix="$artifacts" -print_final_stats=1 "$scratch" "$corpus" >"$log" 2>&1; then
    cat "$log" >&2
    echo "test-sanitizers: $target failed; the input that did it is in $artifacts" >&2
    exit 1
  fi
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|Done)" "$log" || true
done
phase "fuzzing"

#!/usr/bin/env bash
# heavykv against llama.cpp on the same GGUF files, side by side in one run (issue 14 section 5;
# docs/BENCHMARKS.md "GGUF models against llama.cpp"). For each weight mix (default: q4_k_m q8_0)
# it writes, once, a random model at the llama3.2-1b shape with `heavykv make-model --format gguf`
# into BENCH_DIR, then, one after the other on an otherwise idle machine, with 2 threads:
#   llama-bench -p 512 -n 128 -r 3                          -> pp512, tg128 tokens/s
#   llama-batched-bench -npp 128 -ntg 128 -npl 32 -c 8192     -> aggregate decode tokens/s
#   load to first token, best of 3 (warm page cache): llama-simple -n 1 "Once" against
#     heavykv run --prompt "Once" --steps (its prompt tokens + 1); both exit after one new token
# and writes BENCH_DIR/peer.json; then heavykv_bench runs its gguf/ cases on the same files and
# prints the ratios (bench_main.cc, --peer_json). The unquantized mixes f32 and bf16 measure long
# prompts only (issue 18): llama-bench -p 4096 -n 0 -r 1 against gguf/llama3.2-1b/<mix>/prefill4096.
#
# With --decode-b1 first, it measures batch-1 decode only (issue 28), alternating the two tools
# for DECODE_ROUNDS rounds (default 5; scripts/bench_decode_b1.py): llama-bench -p 0 -n 64
# against `heavykv run` decoding 64 tokens, each with its wall and CPU time and the VM's steal
# time, and prints the ratio of the medians (default mixes: q4_k_m q8_0 q6_k q5_k_m q4_0).
#
# With --prefix-ttft first, it measures prefix caching only (issue 30; scripts/bench_prefix_ttft.py):
# llama-server (its prompt cache: a slot reuses the prefix its last prompt shares) and
# `heavykv serve` (its OpenAI HTTP API, prefix cache on) on the same file, one request after
# another over HTTP, PREFIX_ROUNDS rounds (default 3), each round a new 2,000-token prefix:
# the time to a 1-token answer of prefix + suffix B after prefix + suffix A, and cold.
#
# With --n-choices first, it measures n choices on one prompt only (issue 44;
# scripts/bench_n_choices.py): llama-server with 8 slots (-np 8, its prompt cache on) sent the
# same 2,000-token prompt 8 times at once, against one `heavykv serve` request with n = 8, each
# choice 64 tokens, NCHOICES_ROUNDS rounds (default 3): the time to the last answer's end.
#
# usage: scripts/bench-llamacpp.sh [--decode-b1|--prefix-ttft|--n-choices] LLAMA_CPP_BIN_DIR [BENCH_DIR] [MIX...]
#   LLAMA_CPP_BIN_DIR: llama.cpp's build/bin (../shared/tools/setup-llamacpp.sh builds it)
#   BENCH_DIR: default /tmp/heavykv-bench; HEAVYKV_BUILD: heavykv's build dir (default build)
set -euo pipefail
DECODE_B1=0 PREFIX_TTFT=0 N_CHOICES=0
if [ "${1:-}" = --decode-b1 ]; then DECODE_B1=1; shift; fi
if [ "${1:-}" = --prefix-ttft ]; then PREFIX_TTFT=1; shift; fi
if [ "${1:-}" = --n-choices ]; then N_CHOICES=1; shift; fi
LLAMA=${1:?usage: scripts/bench-llamacpp.sh LLAMA_CPP_BIN_DIR [BENCH_DIR] [MIX...]}
DIR=${2:-/tmp/heavykv-bench}
shift $(( $# >= 2 ? 2 : 1 ))
MIXES=("$@")
BUILD=${HEAVYKV_BUILD:-build}
HK=$BUILD/bin/heavykv
THREADS=2
mkdir -p "$DIR"
make_model() {  # the random llama3.2-1b-shape file of mix $1, written once
  local model=$DIR/llama3.2-1b-$1.gguf
  if [ ! -f "$model" ]; then
    "$HK" make-model --format gguf --shape llama3.2-1b --weight-type "$1" --out "$model.tmp"
    mv "$model.tmp" "$model"
  fi
}
if ((DECODE_B1)); then
  [ ${#MIXES[@]} -eq 0 ] && MIXES=(q4_k_m q8_0 q6_k q5_k_m q4_0)
  for mix in "${MIXES[@]}"; do make_model "$mix"; done
  exec python3 "$(dirname "$0")/bench_decode_b1.py" "$LLAMA" "$HK" "$DIR" "${DECODE_ROUNDS:-5}" \
    $THREADS "${MIXES[@]}"
fi
if ((PREFIX_TTFT)); then
  [ ${#MIXES[@]} -eq 0 ] && MIXES=(q4_k_m)
  for mix in "${MIXES[@]}"; do make_model "$mix"; done
  exec python3 "$(dirname "$0")/bench_prefix_ttft.py" "$LLAMA" "$HK" "$DIR" \
    "${PREFIX_ROUNDS:-3}" $THREADS "${MIXES[@]}"
fi
if ((N_CHOICES)); then
  [ ${#MIXES[@]} -eq 0 ] && MIXES=(q4_k_m)
  for mix in "${MIXES[@]}"; do make_model "$mix"; done
  exec python3 "$(dirname "$0")/bench_n_choices.py" "$LLAMA" "$HK" "$DIR" \
    "${NCHOICES_ROUNDS:-3}" $THREADS "${MIXES[@]}"
fi
[ ${#MIXES[@]} -eq 0 ] && MIXES=(q4_k_m q8_0)
now() { date +%s.%N; }
best_of_3() {  # prints the shortest wall time of three runs of "$@" (output discarded)
  local best=
  for _ in 1 2 3; do
    local t0 t1
    t0=$(now)
    if ! "$@" >/dev/null 2>"$DIR/last-run.err"; then
      echo "bench-llamacpp: failed: $*" >&2; cat "$DIR/last-run.err" >&2; exit 1
    fi
    t1=$(now)
    best=$(python3 -c "a=$t1-$t0; b='$best'; print(a if not b or a < float(b) else b)")
  done
  echo "$best"
}

PEER=$DIR/peer.json
echo "{\"cpu\": \"$(lscpu | sed -n 's/^Model name: *//p' | head -1)\", \"threads\": $THREADS, \"models\": {" >"$PEER.tmp"
first=1
for mix in "${MIXES[@]}"; do
  model=$DIR/llama3.2-1b-$mix.gguf
  make_model "$mix"
  if [ "$mix" = f32 ] || [ "$mix" = bf16 ]; then
    echo "== $mix: llama-bench -p 4096" >&2
    "$LLAMA/llama-bench" -m "$model" -p 4096 -n 0 -r 1 -t $THREADS -o json \
      >"$DIR/llama-bench-$mix-pp4096.json"
    python3 - "$DIR/llama-bench-$mix-pp4096.json" "$mix" "$first" >>"$PEER.tmp" <<'PY'
import json, sys
bench, mix, first = sys.argv[1:4]
pp = next(r["avg_ts"] for r in json.load(open(bench)) if r["n_prompt"] == 4096)
print(("" if first == "1" else ",") + json.dumps(mix) + ": " + json.dumps({"pp4096": pp}))
PY
    first=0
    continue
  fi
  echo "== $mix: llama-bench" >&2
  "$LLAMA/llama-bench" -m "$model" -p 512 -n 128 -r 3 -t $THREADS -o json >"$DIR/llama-bench-$mix.json"
  echo "== $mix: llama-batched-bench" >&2
  "$LLAMA/llama-batched-bench" -m "$model" -c 8192 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 32 \
    -t $THREADS --output-format jsonl >"$DIR/llama-batched-$mix.jsonl" 2>"$DIR/llama-batched-$mix.log"
  echo "== $mix: load to first token" >&2
  ll=$(best_of_3 "$LLAMA/llama-simple" -m "$model" -n 1 "Once")
  # heavykv run: --steps is the sequence length, so the prompt's tokens plus one new token.
  n=$("$HK" run --model "$model" --prompt "Once" --steps 64 --temperature 0 --threads $THREADS \
      --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["prompt_tokens"])')
  hk=$(best_of_3 "$HK" run --model "$model" --prompt "Once" --steps $((n + 1)) --temperature 0 \
      --threads $THREADS)
  python3 - "$DIR/llama-bench-$mix.json" "$DIR/llama-batched-$mix.jsonl" "$mix" "$ll" "$hk" "$first" >>"$PEER.tmp" <<'PY'
import json, sys
bench, batched, mix, ll, hk, first = sys.argv[1:7]
runs = json.load(open(bench))
pp = next(r["avg_ts"] for r in runs if r["n_prompt"] == 512 and r["n_gen"] == 0)
tg = next(r["avg_ts"] for r in runs if r["n_gen"] == 128 and r["n_prompt"] == 0)
rows = [json.loads(l) for l in open(batched) if l.startswith("{")]
btg = next(r["speed_tg"] for r in rows if r["pl"] == 32)
out = {"pp512": pp, "tg128": tg, "batched_tg_npl32": btg,
       "load_to_first_token_s": float(ll), "heavykv_load_to_first_token_s": float(hk)}
print(("" if first == "1" else ",") + json.dumps(mix) + ": " + json.dumps(out))
PY
  first=0
done
echo "}}" >>"$PEER.tmp"
mv "$PEER.tmp" "$PEER"
cat "$PEER"
filter="^gguf/llama3.2-1b/($(IFS='|'; echo "${MIXES[*]}"))/"
"$BUILD/bin/heavykv_bench" --threads=$THREADS --bench_dir="$DIR" --peer_json="$PEER" \
  --summary_json="$DIR/heavykv-gguf.json" --benchmark_filter="$filter"

#!/usr/bin/env bash
# Issue 41's targets, measured with `heavykv bench` on the bundled model (a fresh `heavykv serve`
# on loopback ports of its own choosing for each part):
#   (a) idle: tokens/s of the measured load (LOAD_CONCURRENCY clients, LOAD_REQUESTS greedy
#       requests of LOAD_MAX_TOKENS) over gRPC and over HTTP, the server's RSS before and after;
#   (b) the same gRPC load while STALL streams (greedy, STALL_MAX_TOKENS tokens with 20 top
#       logprobs each, every one on a connection of its own) read 2 events, stop reading for
#       SECONDS, then read to the end (T2; --stall-streams);
#   (c) the same over HTTP, the stalled streams too;
#   (d) OVERFLOW connections from 8 source addresses, 256 at a time, that each send a completion
#       (plain and streamed, OVERFLOW_MAX_TOKENS with the window policy, in turn) and 200 KB more,
#       then close, while a probe asks GET /health every 20 ms; then the server's open
#       connections, sequences and KV pages from its /metrics once it settles (T1;
#       --overflow-connections).
# Prints one summary with ratios against the targets; the JSON lines and server logs stay in OUT.
# --stream-stall-timeout (SECONDS + 60, so that the stalls resume before it) is passed only when
# `heavykv serve --help` lists it, so the script also measures a server without it ("before").
#
# usage: scripts/bench-stall.sh [STALL [SECONDS [OVERFLOW]]]   (defaults: 64 120 10000)
#   a quick check (about a minute): QUICK=1 scripts/bench-stall.sh, the same as
#   SETTLE=10 scripts/bench-stall.sh 8 10 1000
#   HEAVYKV_BUILD: build dir (default build); OUT: output dir (default /tmp/heavykv-bench-stall);
#   LOAD_CONCURRENCY (8), LOAD_REQUESTS (128), LOAD_MAX_TOKENS (256): the measured load, which
#   should end within SECONDS (the summary says when it did not); STALL_MAX_TOKENS (2000);
#   OVERFLOW_MAX_TOKENS (100000); SETTLE (30): seconds (d) waits for the server to be idle;
#   SERVE_BIN: the heavykv binary that serves (default: HEAVYKV_BUILD's; bench is always that one);
#   BENCH_TIMEOUT: seconds one bench run may take (default SECONDS + 600); SERVE_ARGS: more serve
#   flags for every server.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${QUICK:-}" ]; then
  STALL=${1:-8} SECONDS_STALLED=${2:-10} OVERFLOW=${3:-1000} SETTLE=${SETTLE:-10}
else
  STALL=${1:-64} SECONDS_STALLED=${2:-120} OVERFLOW=${3:-10000}
fi
HK=${HEAVYKV_BUILD:-build}/bin/heavykv
OUT=${OUT:-/tmp/heavykv-bench-stall}
LOAD_CONCURRENCY=${LOAD_CONCURRENCY:-8}
LOAD_REQUESTS=${LOAD_REQUESTS:-128}
LOAD_MAX_TOKENS=${LOAD_MAX_TOKENS:-256}
STALL_MAX_TOKENS=${STALL_MAX_TOKENS:-2000}
OVERFLOW_MAX_TOKENS=${OVERFLOW_MAX_TOKENS:-100000}
SETTLE=${SETTLE:-30}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-$((SECONDS_STALLED + 600))}
read -r -a EXTRA <<<"${SERVE_ARGS:-}"
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.log "$OUT"/*.err
ulimit -n "$(ulimit -Hn)"

SERVE_BIN=${SERVE_BIN:-$HK}  # the server measured (e.g. an older build's binary, "before")
SERVE_HELP=$("$SERVE_BIN" serve --help 2>&1 || true)
has_flag() { grep -q -- "^ *--$1 " <<<"$SERVE_HELP"; }

SERVER_PID='' GRPC='' HTTP='' METRICS=''
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}
trap stop_server EXIT
trap 'exit 130' INT TERM

# Every part's server: room for the stalled streams beside the load (a running slot each), long
# streams past the context, and the stall timeout where the server has one.
longest=$((STALL_MAX_TOKENS > OVERFLOW_MAX_TOKENS ? STALL_MAX_TOKENS : OVERFLOW_MAX_TOKENS))
serve=(--max-running $((STALL + LOAD_CONCURRENCY + 8)) --max-new-tokens-limit "$longest")
if has_flag stream-stall-timeout; then serve+=(--stream-stall-timeout $((SECONDS_STALLED + 60))); fi

# start_server NAME: sets SERVER_PID, GRPC (host:port), HTTP (a URL) and METRICS (a URL).
start_server() {
  local name=$1 log=$OUT/$1.log
  "$SERVE_BIN" serve --model models/stories260K.bin --tokenizer models/tok512.bin \
    --listen 127.0.0.1:0 --metrics-address 127.0.0.1:0 --http-address 127.0.0.1:0 --grace 1 \
    "${serve[@]}" "${EXTRA[@]}" >"$log" 2>&1 &
  SERVER_PID=$!
  local line=
  for _ in $(seq 300); do
    line=$(grep -o 'gRPC listening on [0-9.:]*; metrics on [0-9.:]*; OpenAI HTTP on [0-9.:]*' \
      "$log" 2>/dev/null || true)
    [ -n "$line" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$line" ]; then
    echo "bench-stall: the $name server did not start:" >&2
    cat "$log" >&2
    exit 1
  fi
  local re='gRPC listening on ([0-9.:]+); metrics on ([0-9.:]+); OpenAI HTTP on ([0-9.:]+)'
  [[ $line =~ $re ]]
  GRPC=${BASH_REMATCH[1]}
  METRICS=http://${BASH_REMATCH[2]}/metrics
  HTTP=http://${BASH_REMATCH[3]}
}

# run_bench NAME [bench flags...]: a fresh server and one `heavykv bench --json` against it, into
# NAME.json (its exit code is kept: failed requests, probes or stalls are results here). A flag
# value @HTTP stands for the server's OpenAI URL.
run_bench() {
  local name=$1 args=() a
  shift
  start_server "$name"
  for a in "$@"; do
    if [ "$a" = @HTTP ]; then args+=("$HTTP"); else args+=("$a"); fi
  done
  echo "bench-stall: $name ..." >&2
  # A fresh server's first requests are slow (pages, caches): warm it with the load's shape.
  "$HK" bench --server "$GRPC" --prompt-tokens 32 --concurrency "$LOAD_CONCURRENCY" \
    --requests "$LOAD_CONCURRENCY" --max-tokens "$LOAD_MAX_TOKENS" --json >/dev/null 2>&1 || true
  local rc=0
  timeout "$BENCH_TIMEOUT" "$HK" bench --server "$GRPC" --server-pid "$SERVER_PID" \
    --metrics-url "$METRICS" --prompt-tokens 32 --json "${args[@]}" >"$OUT/$name.json" \
    2>"$OUT/$name.err" || rc=$?
  [ "$rc" = 124 ] && echo "{\"timed_out\": $BENCH_TIMEOUT}" >"$OUT/$name.json"
  [ -s "$OUT/$name.json" ] || echo "{\"exit_code\": $rc}" >"$OUT/$name.json"
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "bench-stall: the server exited during $name (its log: $OUT/$name.log)" >&2
  fi
  stop_server
}

# run_stalled NAME [--http]: a fresh server; the stalled streams from one `heavykv bench` in the
# background (its own process: 64 stalled gRPC channels in the measuring client's process slow
# that client down, not the server), then, once the server generates nothing more (they are all
# held, their socket buffers full), the measured load from another; NAME.json is the load's
# result with the stalled streams' "stall" and "server" (RSS) objects.
run_stalled() {
  local name=$1 http=${2:-} front=()
  start_server "$name"
  if [ "$http" = --http ]; then front=(--http "$HTTP"); fi
  echo "bench-stall: $name ..." >&2
  "$HK" bench --server "$GRPC" --prompt-tokens 32 --concurrency "$LOAD_CONCURRENCY" \
    --requests "$LOAD_CONCURRENCY" --max-tokens "$LOAD_MAX_TOKENS" --json >/dev/null 2>&1 || true
  timeout "$BENCH_TIMEOUT" "$HK" bench --server "$GRPC" --server-pid "$SERVER_PID" \
    --prompt-tokens 32 --json --requests 0 "${stall[@]}" --stall-settle-seconds 0 \
    "${front[@]}" >"$OUT/$name-stall.json" 2>"$OUT/$name-stall.err" &
  local stalled=$!
  # Settled: the token counter still for two seconds (60 s at most); the held count is logged.
  local last=-1 still=0 now held
  for _ in $(seq 120); do
    sleep 0.5
    now=$(curl -s "$METRICS" | awk '$1 == "heavykv_generation_tokens_total" {print $2}')
    held=$(curl -s "$METRICS" | awk '$1 == "heavykv_requests_held" {print $2}')
    if [ "$now" = "$last" ]; then still=$((still + 1)); else still=0; fi
    last=$now
    [ "$still" -ge 4 ] && break
  done
  echo "bench-stall: $name settled (held ${held:-none}, tokens $now); the load runs" >&2
  timeout "$BENCH_TIMEOUT" "$HK" bench --server "$GRPC" --metrics-url "$METRICS" \
    --prompt-tokens 32 --json "${load[@]}" "${front[@]}" >"$OUT/$name-load.json" \
    2>"$OUT/$name.err" || true
  wait "$stalled" || true
  python3 - "$OUT/$name-load.json" "$OUT/$name-stall.json" >"$OUT/$name.json" <<'PY'
import json, sys
load = json.loads(open(sys.argv[1]).readline() or "{}")
stall = json.loads(open(sys.argv[2]).readline() or "{}")
for key in ("stall", "server"):
    if key in stall:
        load[key] = stall[key]
print(json.dumps(load))
PY
  stop_server
}

load=(--concurrency "$LOAD_CONCURRENCY" --requests "$LOAD_REQUESTS" --max-tokens "$LOAD_MAX_TOKENS"
  --temperature 0)
stall=(--stall-streams "$STALL" --stall-seconds "$SECONDS_STALLED"
  --stall-max-tokens "$STALL_MAX_TOKENS")
run_bench a-grpc "${load[@]}"
run_bench a-http "${load[@]}" --http @HTTP
run_stalled b-grpc
run_stalled c-http --http
run_bench d-overflow --http @HTTP --requests 0 \
  --overflow-connections "$OVERFLOW" --overflow-max-tokens "$OVERFLOW_MAX_TOKENS" \
  --slow-sources 8 --probe-path /health --probe-interval-ms 20 --settle-seconds "$SETTLE"

python3 - "$OUT" "$STALL" "$SECONDS_STALLED" "$OVERFLOW" <<'EOF'
import json, sys
out, stall, seconds, overflow = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
runs = {}
for name in ("a-grpc", "a-http", "b-grpc", "c-http", "d-overflow"):
    with open(f"{out}/{name}.json") as f:
        runs[name] = json.loads(f.readline() or "{}")

def tok_s(r):
    return r.get("output_tokens_per_second")

def rss(r):
    s = r.get("server", {})
    if "after" not in s:
        return "exited or not sampled"
    b, p, a = s["before"]["rss_mb"], s["peak"]["rss_mb"], s["after"]["rss_mb"]
    return (f"RSS MB {b} -> peak {p} -> after {a} (growth at the peak {p - b:.1f}, after "
            f"{a - b:.1f}; target <= 20)")

def metrics(r):
    m = r.get("metrics", {})
    if "values" not in m:
        return f"metrics: {m.get('error', 'none')}"
    v = {k.removeprefix("heavykv_"): x for k, x in m["values"].items()}
    settled = m["settled_seconds"]
    return (f"after: open connections {v['http_open_connections']}, running "
            f"{v['requests_running']}, waiting {v['requests_waiting']}, KV pages used "
            f"{v['kv_pages_used']} (target all 0; "
            f"{'idle ' + str(settled) + ' s after the load' if settled is not None else 'not idle'}"
            f"; cached prefix pages {v['prefix_cache_cached_pages']})")

print(f"heavykv issue 41 targets (files in {out})")
for name, title, base in (("a-grpc", "(a) idle server, gRPC load", None),
                          ("a-http", "(a) idle server, HTTP load", None),
                          ("b-grpc", f"(b) {stall} streams stalled {seconds:g} s over gRPC", "a-grpc"),
                          ("c-http", f"(c) {stall} streams stalled {seconds:g} s over HTTP", "a-http")):
    r = runs[name]
    print(f"\n{title}")
    if "requests" not in r:
        print(f"  no result: {r}")
        continue
    errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items())
    line = (f"  load       {r['ok']}/{r['requests']} ok{'; ' + errors if errors else ''}; "
            f"{tok_s(r)} tokens/s in {r['seconds']} s")
    if base and tok_s(runs[base]):
        line += f"; {tok_s(r) / tok_s(runs[base]):.3f} x idle (target >= 0.9)"
    print(line)
    if "stall" in r:
        s = r["stall"]
        errs = ", ".join(f"{k} {v}" for k, v in s["errors"].items())
        print(f"  stalled    {s['matched']}/{s['streams']} matched the reference "
              f"({s['reference_tokens']} tokens); {s['differed']} differed, {s['cancelled']} "
              f"cancelled, {s['failed']} failed{': ' + errs if errs else ''}; resumed in max "
              f"{s['resume_ms']['max']} ms")
        if r["seconds"] > seconds:
            print(f"  note       the load ran {r['seconds']} s, longer than the stall: lower "
                  "LOAD_REQUESTS")
    print(f"  server     {rss(r)}")
    print(f"  server     {metrics(r)}")

r = runs["d-overflow"]
print(f"\n(d) {overflow} connections of a request + 200 KB, then close")
if "overflow" not in r:
    print(f"  no result: {r}")
else:
    o = r["overflow"]
    if "error" in o:
        print(f"  overflow   {o['error']}")
    else:
        answered = ", ".join(f"{k} {v}" for k, v in o["responses"].items())
        print(f"  overflow   {o['opened']} opened, {o['connect_failures']} connect failures, "
              f"{o['sent_all']} sent everything, {o['send_stalled']} stalled sending, "
              f"{o['closed_by_server']} closed by the server first, in {o['seconds']} s; "
              f"answered: {answered}")
    p = r.get("probe")
    if p:
        lat = p["latency_ms"]
        why = ", ".join(f"{k} {v}" for k, v in p["failures"].items())
        print(f"  probe      GET {p['path']}: {p['ok']}/{p['sent']} ok{': ' + why if why else ''}; "
              f"ms p50 {lat['p50']}  p99 {lat['p99']} (target <= 50)  max {lat['max']}")
    print(f"  server     {rss(r)}")
    print(f"  server     {metrics(r)}")
EOF

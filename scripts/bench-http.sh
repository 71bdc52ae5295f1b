#!/usr/bin/env bash
# The OpenAI HTTP front under connection load (issue 33): `heavykv serve` on the bundled model
# (loopback ports of its own choosing), loaded by `heavykv bench` (its --slow-connections flood,
# GET /v1/models probe and --server-pid sampling; server/client/front_load.h), in three parts:
#   (a) idle front: probe latency and the TTFT of 1000 greedy completions one at a time over HTTP;
#   (b) the same while SLOW half-header connections from 8 source addresses (127.0.0.2..9, so
#       that a per-client cap does not refuse them) are held open;
#   (c) STREAMS concurrent SSE streams over HTTP against as many gRPC streams (3 x STREAMS
#       requests each, a fresh server each, sized so that all of them are admitted at once), with
#       the server's RSS and threads before, at the peak and after.
# Prints one summary; the JSON lines and server logs stay in OUT. Flags of the event-driven front
# (--http-max-connections, --http-max-connections-per-client) are passed only when
# `heavykv serve --help` lists them, so the script also measures the older front ("before").
#
# usage: scripts/bench-http.sh [SLOW [STREAMS]]     (defaults: 10000 1000)
#   HEAVYKV_BUILD: build dir (default build); OUT: output dir (default /tmp/heavykv-bench-http);
#   BENCH_TIMEOUT: seconds one bench run may take (default 600); HTTP_THREADS: serve's
#   --http-threads in (c) (default: serve's own); SERVE_ARGS: more serve flags for every server.
set -euo pipefail
cd "$(dirname "$0")/.."
SLOW=${1:-10000}
STREAMS=${2:-1000}
HK=${HEAVYKV_BUILD:-build}/bin/heavykv
OUT=${OUT:-/tmp/heavykv-bench-http}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-600}
read -r -a EXTRA <<<"${SERVE_ARGS:-}"
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.log
# Every socket is a file: the flood's here and, on the server's side, one per connection.
ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((SLOW + STREAMS + 1024)) ]; then
  echo "bench-http: the file limit $(ulimit -n) is too low for $SLOW slow connections" >&2
  exit 1
fi

SERVE_HELP=$("$HK" serve --help 2>&1 || true)
has_flag() { grep -q -- "^ *--$1 " <<<"$SERVE_HELP"; }

SERVER_PID='' GRPC='' HTTP=''
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

# start_server NAME [serve flags...]: sets SERVER_PID, GRPC (host:port) and HTTP (a URL).
start_server() {
  local name=$1 log=$OUT/$1.log
  shift
  "$HK" serve --model models/stories260K.bin --tokenizer models/tok512.bin \
    --listen 127.0.0.1:0 --metrics-address 127.0.0.1:0 --http-address 127.0.0.1:0 --grace 1 \
    "$@" "${EXTRA[@]}" >"$log" 2>&1 &
  SERVER_PID=$!
  local line=
  for _ in $(seq 300); do
    line=$(grep -o 'gRPC listening on [0-9.:]*; metrics on [0-9.:]*; OpenAI HTTP on [0-9.:]*' \
      "$log" || true)
    [ -n "$line" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$line" ]; then
    echo "bench-http: the $name server did not start:" >&2
    cat "$log" >&2
    exit 1
  fi
  [[ $line =~ gRPC\ listening\ on\ ([0-9.:]+)\;.*OpenAI\ HTTP\ on\ ([0-9.:]+) ]]
  GRPC=${BASH_REMATCH[1]}
  HTTP=http://${BASH_REMATCH[2]}
}

# run_bench NAME [bench flags...]: one `heavykv bench --json` against the server, into NAME.json
# (its exit code is kept: failed requests or probes are results here, not errors).
run_bench() {
  local name=$1
  shift
  echo "bench-http: $name ..." >&2
  local rc=0
  timeout "$BENCH_TIMEOUT" "$HK" bench --server "$GRPC" --server-pid "$SERVER_PID" \
    --prompt-tokens 32 --max-tokens 32 --json "$@" >"$OUT/$name.json" 2>"$OUT/$name.err" || rc=$?
  [ "$rc" = 124 ] && echo "{\"timed_out\": $BENCH_TIMEOUT}" >"$OUT/$name.json"
  [ -s "$OUT/$name.json" ] || echo "{\"exit_code\": $rc}" >"$OUT/$name.json"
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "bench-http: the server exited during $name (its log: $OUT/*.log)" >&2
  fi
}

# (a) and (b): one server, its defaults (and room for the flood where the caps exist).
caps=()
if has_flag http-max-connections; then caps+=(--http-max-connections $((SLOW + 4096))); fi
if has_flag http-max-connections-per-client; then
  caps+=(--http-max-connections-per-client $((SLOW / 8 + 4096)))
fi
start_server front "${caps[@]}"
# Greedy completions one at a time, long enough for ~250 probes 20 ms apart.
one=(--http "$HTTP" --concurrency 1 --requests 1000 --temperature 0 --probe-interval-ms 20)
run_bench a-idle "${one[@]}" --slow-connections 0
run_bench b-slow "${one[@]}" --slow-connections "$SLOW" --slow-kind half-header --slow-sources 8
stop_server

# (c): STREAMS sequences of 64 tokens (20 pages of 16 tokens over 5 layers) admitted at once.
streams=(--max-running $((STREAMS + 24)) --max-step-tokens $((2 * STREAMS + 512))
  --kv-pages $((STREAMS * 24 + 1024)) --max-waiting $((4 * STREAMS + 256))
  --max-streams-per-connection $((STREAMS + 24)))
[ -n "${HTTP_THREADS:-}" ] && streams+=(--http-threads "$HTTP_THREADS")
start_server streams-http "${streams[@]}"
run_bench c-http --http "$HTTP" --concurrency "$STREAMS" --requests $((3 * STREAMS))
stop_server
start_server streams-grpc "${streams[@]}"
run_bench c-grpc --concurrency "$STREAMS" --requests $((3 * STREAMS))
stop_server

python3 - "$OUT" "$SLOW" "$STREAMS" <<'EOF'
import json, sys
out, slow, streams = sys.argv[1], sys.argv[2], sys.argv[3]
names = [("a-idle", "(a) idle front, HTTP, concurrency 1"),
         ("b-slow", f"(b) {slow} half-header connections held, HTTP, concurrency 1"),
         ("c-http", f"(c) {streams} streams over HTTP"),
         ("c-grpc", f"(c) {streams} streams over gRPC")]
print(f"heavykv HTTP front under load (files in {out})")
for name, title in names:
    r = json.load(open(f"{out}/{name}.json"))
    print(f"\n{title}")
    if "requests" not in r:
        print(f"  no result: {r}")
        continue
    t = r["ttft_ms"]
    errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items())
    print(f"  requests   {r['ok']}/{r['requests']} ok{'; ' + errors if errors else ''}; "
          f"{r['output_tokens_per_second']} tokens/s, max running {r['max_running']}")
    print(f"  TTFT ms    p50 {t['p50']}  p90 {t['p90']}  p99 {t['p99']}")
    if "probe" in r:
        p = r["probe"]
        lat = p["latency_ms"]
        why = ", ".join(f"{k} {v}" for k, v in p["failures"].items())
        print(f"  probe      {p['ok']}/{p['sent']} ok{': ' + why if why else ''}; "
              f"ms p50 {lat['p50']}  p99 {lat['p99']}  max {lat['max']}")
    if "slow_flood" in r:
        f = r["slow_flood"]
        closed = ", ".join(f"{k} {v}" for k, v in f["closed_by"].items())
        print(f"  flood      open min {f['open_min']} mean {f['open_mean']} of "
              f"{f['connections']} (ramp {f['ramp_seconds']} s); {f['reconnects']} reconnects; "
              f"closed after: {closed}")
    if "server" in r and "after" not in r["server"]:
        print("  server     exited before the run ended: its figures are not comparable")
    if "server" in r and "after" in r["server"]:
        s = r["server"]
        b, pk, a = s["before"], s["peak"], s["after"]
        print(f"  server     RSS MB {b['rss_mb']} -> peak {pk['rss_mb']} -> after {a['rss_mb']} "
              f"(growth {s['rss_growth_mb']}; target <= 100); threads {b['threads']} -> peak "
              f"{pk['threads']} -> after {a['threads']} (left {s['threads_left']}; target 0; "
              f"of them the HTTP front's {b.get('http_threads')} -> {pk.get('http_threads')} -> "
              f"{a.get('http_threads')})")
EOF

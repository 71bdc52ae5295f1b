#!/usr/bin/env python3
"""Routing across heavykv replicas, simulated (issue 31): round robin against an endpoint picker.

Starts N local `heavykv serve` replicas and replays one seeded open-loop workload against them
once per routing policy, over the OpenAI HTTP API (streamed /v1/completions, the front the Gateway
API Inference Extension routes):

  round-robin  request i goes to replica i mod N, as a plain Service or Gateway backend does;
  least-kv     a picker shaped as the Inference Extension's endpoint picker (EPP v1.5.0 default
               profile): every --scrape-ms (50, the EPP's refresh interval) each replica's
               /metrics is scraped; a request goes to the replica with the highest
                 2 * queue score + 2 * KV score
               where queue score = (max_waiting - waiting) / (max_waiting - min_waiting) over the
               replicas (1 for all when the queues are equal; heavykv_requests_waiting) and KV score
               = 1 - heavykv_kv_cache_usage_ratio; ties are broken at random (seeded). The EPP's
               third default scorer, prefix cache (weight 3), is left out: the prompts here share
               no prefix, so it would score every replica 0.

Both policies scrape the same way (round robin ignores what it reads), so the scrapes cost the
replicas the same CPU. Each run starts fresh replicas. The workload (seeded: --seed) is a mix of
interactive requests (short prompt, short answer) and document requests (long prompt, long
answer), arriving as a Poisson process; see workload() and docs/BENCHMARKS.md. Prompts are random
token ids after BOS and every request sets ignore_eos, so each generates exactly its max_tokens.

Reports, per run: requests (and long ones) per replica, TTFT p50/p99 (all requests, and the
interactive ones alone), end-to-end latency p50/p99, output tokens/s over the run's wall time,
failures; then, per seed and policy and over everything, TTFT p50/p90/p99 and E2E p50/p99 of all
the repeats' requests pooled. Exits 1 if any request failed. The run in docs/BENCHMARKS.md:

  scripts/route_sim.py --binary build/bin/heavykv --model /tmp/route-sim/s15m-2k.bin \\
      --tokenizer models/tok512.bin --replicas 2 --threads 1 --kv-pool-mb 32 --requests 400 \\
      --rate 5 --seed 1,2,3 --repeats 2 --quiet-file /tmp/bench.lock [--json OUT]
"""

import argparse
import http.client
import json
import math
import os
import random
import re
import socket
import tempfile
import subprocess
import sys
import threading
import time
import urllib.request

QUEUE_WEIGHT, KV_WEIGHT = 2.0, 2.0  # the EPP v1.5.0 default profile's weights


# ---------------------------------------------------------------- the picker (no I/O: tested)

def parse_metrics(text):
    """{'waiting', 'running', 'kv_usage'} of one heavykv /metrics page (Prometheus text format)."""
    wanted = {"heavykv_requests_waiting": "waiting", "heavykv_requests_running": "running",
              "heavykv_kv_cache_usage_ratio": "kv_usage"}
    out = {}
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) in wanted:
            out[wanted[m.group(1)]] = float(m.group(2))
    missing = set(wanted.values()) - set(out)
    if missing:
        raise ValueError(f"metrics page lacks {sorted(missing)}")
    return out


def queue_scores(metrics):
    """The EPP queue scorer: the shortest queue 1, the longest 0, linear between; all 1 if equal."""
    waiting = [m["waiting"] for m in metrics]
    lo, hi = min(waiting), max(waiting)
    if hi == lo:
        return [1.0] * len(metrics)
    return [(hi - w) / (hi - lo) for w in waiting]


def kv_scores(metrics):
    """The EPP KV-cache utilization scorer: 1 - usage, clamped to [0, 1]."""
    return [min(1.0, max(0.0, 1.0 - m["kv_usage"])) for m in metrics]


def scores(metrics):
    q, kv = queue_scores(metrics), kv_scores(metrics)
    return [QUEUE_WEIGHT * a + KV_WEIGHT * b for a, b in zip(q, kv)]


def pick(metrics, rng):
    """Index of the replica with the highest weighted score, ties drawn by rng (max-score)."""
    s = scores(metrics)
    best = max(s)
    return rng.choice([i for i, v in enumerate(s) if v == best])


class RoundRobin:
    name = "round-robin"

    def __init__(self, n):
        self.n, self.next = n, 0

    def choose(self, _metrics):
        i = self.next
        self.next = (self.next + 1) % self.n
        return i


class LeastKv:
    name = "least-kv"

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def choose(self, metrics):
        return pick(metrics, self.rng)


POLICIES = {"round-robin": lambda n, seed: RoundRobin(n), "least-kv": lambda n, seed: LeastKv(seed)}


# ---------------------------------------------------------------- the workload

def workload(n, rate, seed, long_share, short_prompt, short_out, long_prompt, long_out, vocab=512):
    """n requests: (arrival seconds, kind, prompt token ids, max_tokens), Poisson at `rate`/s.

    Each request is independently a document request with probability long_share (its prompt and
    answer lengths uniform in long_prompt / long_out), else an interactive one (short_*). Nothing
    orders them: a replica gets several long ones at once only by chance, as in production.
    """
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        long = rng.random() < long_share
        p_lo, p_hi = long_prompt if long else short_prompt
        o_lo, o_hi = long_out if long else short_out
        prompt = [1] + [rng.randrange(3, vocab) for _ in range(rng.randint(p_lo, p_hi) - 1)]
        out.append((t, "long" if long else "short", prompt, rng.randint(o_lo, o_hi)))
    return out


# ---------------------------------------------------------------- replicas

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    def __init__(self, args, index, log_dir, run_index):
        self.http_port, self.metrics_port = free_port(), free_port()
        cmd = [args.binary, "serve", "--model", args.model, "--listen", "127.0.0.1:0",
               "--http-address", f"127.0.0.1:{self.http_port}",
               "--metrics-address", f"127.0.0.1:{self.metrics_port}",
               "--threads", str(args.threads), "--grace", "1"] + args.serve_arg
        if args.tokenizer:
            cmd += ["--tokenizer", args.tokenizer]
        if args.kv_pool_mb:
            cmd += ["--kv-pool-mb", str(args.kv_pool_mb)]
        self.cmd = cmd
        self.log = open(os.path.join(log_dir, f"run{run_index + 1}-replica{index}.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout=120):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                sys.exit(f"replica exited with {self.proc.returncode}: {' '.join(self.cmd)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/health",
                                            timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        sys.exit(f"replica not ready in {timeout} s: {' '.join(self.cmd)}")

    def scrape(self):
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return parse_metrics(r.read().decode())

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Scraper(threading.Thread):
    """Scrapes every replica each `interval` seconds; latest() is the last complete round."""

    def __init__(self, replicas, interval):
        super().__init__(daemon=True)
        self.replicas, self.interval = replicas, interval
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.snapshot = [r.scrape() for r in replicas]
        self.rounds = 0

    def run(self):
        while not self.stop_event.wait(self.interval):
            try:
                snap = [r.scrape() for r in self.replicas]
            except (OSError, ValueError):
                continue  # keep the last good round, as the EPP keeps stale metrics
            with self.lock:
                self.snapshot, self.rounds = snap, self.rounds + 1

    def latest(self):
        with self.lock:
            return list(self.snapshot)


# ---------------------------------------------------------------- one request, one run

def send(port, prompt, max_tokens, record):
    """Streams one completion; fills record with ttft, e2e, completion_tokens or error."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    start = time.monotonic()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            record["error"] = f"http_{resp.status}"
            resp.read()
            return
        done = False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                record["error"] = "stream_error"
                return
            if chunk.get("usage"):
                record["completion_tokens"] = chunk["usage"]["completion_tokens"]
            if "ttft" not in record and chunk.get("choices") and chunk["choices"][0].get("text"):
                record["ttft"] = time.monotonic() - start
        conn.close()
        if not done:
            record["error"] = "bad_stream"
    except (OSError, http.client.HTTPException, ValueError) as e:
        record["error"] = type(e).__name__
    finally:
        record["e2e"] = time.monotonic() - start


def run_once(args, policy_name, requests, log_dir, run_index, seed):
    replicas = [Replica(args, i, log_dir, run_index) for i in range(args.replicas)]
    try:
        for r in replicas:
            r.wait_ready()
        scraper = Scraper(replicas, args.scrape_ms / 1000)
        scraper.start()
        policy = POLICIES[policy_name](args.replicas, seed * 1000 + run_index)
        records, threads = [], []
        start = time.monotonic()
        for arrival, kind, prompt, max_tokens in requests:
            delay = start + arrival - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            i = policy.choose(scraper.latest())
            rec = {"kind": kind, "replica": i, "prompt_tokens": len(prompt),
                   "max_tokens": max_tokens}
            records.append(rec)
            t = threading.Thread(target=send,
                                 args=(replicas[i].http_port, prompt, max_tokens, rec))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        wall = time.monotonic() - start
        scraper.stop_event.set()
        scraper.join()
    finally:
        for r in replicas:
            r.stop()
    return summarize(policy_name, records, wall, args.replicas)


def percentile(values, p):
    """Nearest-rank percentile (as heavykv bench); 0 for none."""
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v), max(1, math.ceil(p / 100 * len(v)))) - 1]


def summarize(policy, records, wall, n):
    ok = [r for r in records if "error" not in r]
    ttft = [r["ttft"] for r in ok if "ttft" in r]
    ttft_short = [r["ttft"] for r in ok if "ttft" in r and r["kind"] == "short"]
    e2e = [r["e2e"] for r in ok]
    tokens = sum(r.get("completion_tokens", 0) for r in ok)
    errors = {}
    for r in records:
        if "error" in r:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    ms = lambda v, p: round(1000 * percentile(v, p), 1)
    return {
        "policy": policy, "requests": len(records), "ok": len(ok), "errors": errors,
        "per_replica": [sum(1 for r in records if r["replica"] == i) for i in range(n)],
        "long_per_replica": [sum(1 for r in records if r["replica"] == i and r["kind"] == "long")
                             for i in range(n)],
        "ttft_ms": {"p50": ms(ttft, 50), "p99": ms(ttft, 99)},
        "ttft_short_ms": {"p50": ms(ttft_short, 50), "p99": ms(ttft_short, 99)},
        "e2e_ms": {"p50": ms(e2e, 50), "p99": ms(e2e, 99)},
        "completion_tokens": tokens, "seconds": round(wall, 2),
        "output_tokens_per_second": round(tokens / wall, 1) if wall > 0 else 0.0,
        "ttft_s": [round(v, 4) for v in ttft], "e2e_s": [round(v, 4) for v in e2e],
    }


def table(results):
    head = (f"{'run':>3} {'seed':>4} {'policy':<12} {'per replica':<14} {'long':<9} "
            f"{'TTFT p50':>9} {'TTFT p99':>9} {'short p99':>9} {'E2E p50':>9} {'E2E p99':>9} "
            f"{'tok/s':>7} {'failed':>6}  disturbed")
    lines = [head, "-" * len(head)]
    for i, r in enumerate(results):
        lines.append(
            f"{i + 1:>3} {r['seed']:>4} {r['policy']:<12} "
            f"{'/'.join(map(str, r['per_replica'])):<14} "
            f"{'/'.join(map(str, r['long_per_replica'])):<9} "
            f"{r['ttft_ms']['p50']:>9.1f} {r['ttft_ms']['p99']:>9.1f} "
            f"{r['ttft_short_ms']['p99']:>9.1f} {r['e2e_ms']['p50']:>9.1f} "
            f"{r['e2e_ms']['p99']:>9.1f} {r['output_tokens_per_second']:>7.1f} "
            f"{r['requests'] - r['ok']:>6}  {'yes' if r.get('disturbed') else ''}")
    return "\n".join(lines)


def pooled(results, policies, seeds):
    """Per seed and policy, then over everything: percentiles of all its runs' requests at once
    (a p99 of one run of 300 requests is its 3rd-worst request; pooling the repeats steadies it)."""
    head = (f"{'seed':>5} {'policy':<12} {'runs':>4} {'TTFT p50':>9} {'TTFT p90':>9} "
            f"{'TTFT p99':>9} "
            f"{'E2E p50':>9} {'E2E p99':>9}")
    lines = ["pooled over the repeats (ms):", head, "-" * len(head)]
    for seed in list(seeds) + ["all"]:
        for p in policies:
            mine = [r for r in results if r["policy"] == p and seed in ("all", r["seed"])]
            ttft = [v for r in mine for v in r["ttft_s"]]
            e2e = [v for r in mine for v in r["e2e_s"]]
            lines.append(f"{seed:>5} {p:<12} {len(mine):>4} {1000 * percentile(ttft, 50):>9.1f} "
                         f"{1000 * percentile(ttft, 90):>9.1f} "
                         f"{1000 * percentile(ttft, 99):>9.1f} {1000 * percentile(e2e, 50):>9.1f} "
                         f"{1000 * percentile(e2e, 99):>9.1f}")
    return "\n".join(lines)


def wait_quiet(path):
    while path and os.path.exists(path):
        time.sleep(5)


def run_quiet(args, policy, requests, run_index, seed):
    """run_once after --quiet-file is gone; "disturbed" says whether it came back meanwhile."""
    wait_quiet(args.quiet_file)
    seen, stop = [False], threading.Event()

    def watch():
        while not stop.wait(1):
            seen[0] = seen[0] or bool(args.quiet_file and os.path.exists(args.quiet_file))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    r = run_once(args, policy, requests, args.log_dir, run_index, seed)
    stop.set()
    watcher.join()
    r["seed"], r["disturbed"] = seed, seen[0]
    return r


def span(text):
    lo, hi = (int(x) for x in text.split(","))
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"{text}: want LO,HI with 1 <= LO <= HI")
    return lo, hi


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/bin/heavykv")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="--threads of each replica")
    ap.add_argument("--kv-pool-mb", type=int, default=0, help="--kv-pool-mb of each replica")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more argument for every `heavykv serve` (repeatable)")
    ap.add_argument("--policies", default="round-robin,least-kv")
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of each policy, alternating (rr, lkv, rr, lkv, ...)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=4.0, help="mean arrivals per second (Poisson)")
    ap.add_argument("--seed", type=lambda t: [int(x) for x in t.split(",")], default=[1],
                    help="workload seed(s), comma-separated: each is one workload, run in turn")
    ap.add_argument("--vocab", type=int, default=512, help="prompt ids are drawn from 3..vocab-1")
    ap.add_argument("--long-share", type=float, default=0.15)
    ap.add_argument("--short-prompt", type=span, default=(32, 256))
    ap.add_argument("--short-out", type=span, default=(16, 96))
    ap.add_argument("--long-prompt", type=span, default=(768, 1536))
    ap.add_argument("--long-out", type=span, default=(128, 384))
    ap.add_argument("--scrape-ms", type=float, default=50.0)
    ap.add_argument("--log-dir", default="", help="replica logs (default: a new temp dir)")
    ap.add_argument("--quiet-file", default="",
                    help="on a shared machine: wait while this file exists before each run, and "
                         "mark runs during which it appeared as disturbed")
    ap.add_argument("--json", default="", help="also write the results to this file")
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    if any(p not in POLICIES for p in policies) or args.replicas < 1 or args.repeats < 1:
        ap.error(f"--policies from {sorted(POLICIES)}; --replicas, --repeats at least 1")
    if not args.log_dir:
        args.log_dir = tempfile.mkdtemp(prefix="route-sim-")
    os.makedirs(args.log_dir, exist_ok=True)

    results = []
    for seed in args.seed:
        requests = workload(args.requests, args.rate, seed, args.long_share, args.short_prompt,
                            args.short_out, args.long_prompt, args.long_out, args.vocab)
        n_long = sum(1 for r in requests if r[1] == "long")
        print(f"workload seed {seed}: {len(requests)} requests ({n_long} long) over "
              f"{requests[-1][0]:.1f} s, {sum(len(r[2]) for r in requests)} prompt + "
              f"{sum(r[3] for r in requests)} output tokens; {args.replicas} replicas; "
              f"logs in {args.log_dir}", flush=True)
        for rep in range(args.repeats):
            for p in policies:
                for attempt in range(3):  # a disturbed run is redone, twice at most
                    r = run_quiet(args, p, requests, len(results), seed)
                    if not r["disturbed"]:
                        break
                    print(f"run {len(results) + 1} {p} disturbed by {args.quiet_file}; "
                          f"{'again' if attempt < 2 else 'kept'}", flush=True)
                results.append(r)
                print(f"run {len(results)} {p}: TTFT p99 {r['ttft_ms']['p99']} ms, "
                      f"{r['output_tokens_per_second']} tok/s, {r['requests'] - r['ok']} failed",
                      flush=True)
    print()
    print(table(results))
    print()
    print(pooled(results, policies, args.seed))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "results": results}, f, indent=1)
    return 1 if any(r["ok"] < r["requests"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

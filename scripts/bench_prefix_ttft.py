#!/usr/bin/env python3
"""Prefix caching against llama-server on the same GGUF file (issue 30; run by
scripts/bench-llamacpp.sh --prefix-ttft). Both servers run at once, idle while the other works;
requests go one at a time over HTTP, alternating servers. Each round takes a new 2,000-token
prefix P (random ids: the models have random weights) and, on each server:
  cold: P + suffix C, never seen before               -> seconds to a 1-token answer
  send: P + suffix A (untimed: puts P in the cache)
  warm: P + suffix B                                   -> seconds to a 1-token answer
llama-server keeps a slot's last prompt and reuses what the next one shares with it (one slot,
cache_prompt on, its default); heavykv reuses the registered blocks (its default). The answer is
one token (max_tokens / n_predict 1), so the time is the time to first token plus one HTTP round
trip on localhost. Prints each round and the medians, and the ratio heavykv warm / llama-server
warm (the issue's target: <= 1.0).

usage: bench_prefix_ttft.py LLAMA_BIN_DIR HEAVYKV_BIN BENCH_DIR ROUNDS THREADS MIX...
"""

import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

PREFIX, SUFFIX = 2000, 24


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        data = json.loads(r.read())
    return time.monotonic() - t0, data


def wait_ready(url, proc, what):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    sys.exit(f"{what} did not become ready")


def main():
    llama_dir, hk, bench_dir, rounds, threads = sys.argv[1:6]
    rounds, threads = int(rounds), int(threads)
    for mix in sys.argv[6:]:
        model = os.path.join(bench_dir, f"llama3.2-1b-{mix}.gguf")
        lp, hp = free_port(), free_port()
        llama = subprocess.Popen(
            [os.path.join(llama_dir, "llama-server"), "-m", model, "-t", str(threads), "-c", "4096",
             "-np", "1", "--host", "127.0.0.1", "--port", str(lp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        heavy = subprocess.Popen(
            [hk, "serve", "--model", model, "--threads", str(threads), "--listen", "127.0.0.1:0",
             "--metrics-address", "", "--http-address", f"127.0.0.1:{hp}", "--max-running", "4",
             "--kv-pool-mb", "1024"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(f"http://127.0.0.1:{lp}/health", llama, "llama-server")
            wait_ready(f"http://127.0.0.1:{hp}/health", heavy, "heavykv serve")
            servers = {
                "llama-server": lambda ids: post(f"http://127.0.0.1:{lp}/completion",
                                                 {"prompt": ids, "n_predict": 1,
                                                  "cache_prompt": True, "temperature": 0}),
                "heavykv": lambda ids: post(f"http://127.0.0.1:{hp}/v1/completions",
                                            {"prompt": ids, "max_tokens": 1, "temperature": 0}),
            }
            rng = random.Random(30)
            ids = lambda n: [rng.randrange(100, 30000) for _ in range(n)]
            times = {name: {"cold": [], "warm": []} for name in servers}
            cached = []
            for r in range(rounds):
                for name, call in servers.items():
                    p = ids(PREFIX)
                    cold, _ = call(p + ids(SUFFIX))
                    p = ids(PREFIX)
                    call(p + ids(SUFFIX))
                    warm, data = call(p + ids(SUFFIX))
                    if name == "heavykv":
                        cached.append(data["usage"]["prompt_tokens_details"]["cached_tokens"])
                    times[name]["cold"].append(cold)
                    times[name]["warm"].append(warm)
                    print(f"{mix} round {r} {name}: cold {cold:.3f} s, warm {warm:.3f} s", flush=True)
            med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
            for n, m in med.items():
                print(f"{mix} {n}: median cold {m['cold']:.3f} s, warm {m['warm']:.3f} s, "
                      f"warm/cold {m['warm'] / m['cold']:.3f}")
            print(f"{mix} heavykv cached_tokens per warm request: {cached}")
            print(f"{mix} TTFT warm, heavykv / llama-server: "
                  f"{med['heavykv']['warm'] / med['llama-server']['warm']:.3f} (target <= 1.0); "
                  f"cold: {med['heavykv']['cold'] / med['llama-server']['cold']:.3f}")
        finally:
            for p in (llama, heavy):
                p.terminate()
                p.wait()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""n choices on one prompt against llama-server on the same GGUF file (issue 44; run by
scripts/bench-llamacpp.sh --n-choices). Both servers run at once, idle while the other works.
Each round takes a new 2,000-token prompt P (random ids: the models have random weights) and,
one server after the other:
  llama-server (-np 8: eight slots, its prompt cache on): P sent 8 times at once, each asking for
      64 tokens (n_predict 64, temperature 1, ignore_eos)
  heavykv serve: one request for P with n = 8 (max_tokens 64, temperature 1, ignore_eos): the
      prompt runs once and forks into 8 sequences on its pages
and times, from the first byte sent, the end of the last answer. Prints each round, the medians
and the ratio heavykv / llama-server (the issue's target: <= 0.7). HK_ARGS adds flags to
`heavykv serve` (e.g. "--kv-dtype bf16").

usage: bench_n_choices.py LLAMA_BIN_DIR HEAVYKV_BIN BENCH_DIR ROUNDS THREADS MIX...
"""

import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from bench_prefix_ttft import free_port, wait_ready

PROMPT, NEW, N = 2000, 64, 8


def post(url, body):
    """POST `body` as JSON; (seconds, the JSON answer). No timeout: llama-server's eight slots
    have taken over ten minutes here."""
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=7200) as r:
        data = json.loads(r.read())
    return time.monotonic() - t0, data


def main():
    llama_dir, hk, bench_dir, rounds, threads = sys.argv[1:6]
    rounds, threads = int(rounds), int(threads)
    for mix in sys.argv[6:]:
        model = os.path.join(bench_dir, f"llama3.2-1b-{mix}.gguf")
        lp, hp = free_port(), free_port()
        llama = subprocess.Popen(
            [os.path.join(llama_dir, "llama-server"), "-m", model, "-t", str(threads),
             "-c", str(N * (PROMPT + NEW + 64)), "-np", str(N), "--host", "127.0.0.1",
             "--port", str(lp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        heavy = subprocess.Popen(
            [hk, "serve", "--model", model, "--threads", str(threads), "--listen", "127.0.0.1:0",
             "--metrics-address", "", "--http-address", f"127.0.0.1:{hp}", "--kv-pool-mb", "1024"]
            + shlex.split(os.environ.get("HK_ARGS", "")),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(f"http://127.0.0.1:{lp}/health", llama, "llama-server")
            wait_ready(f"http://127.0.0.1:{hp}/health", heavy, "heavykv serve")

            def llama_round(ids):
                tokens = [0] * N

                def one(i):
                    _, data = post(f"http://127.0.0.1:{lp}/completion",
                                   {"prompt": ids, "n_predict": NEW, "cache_prompt": True,
                                    "temperature": 1.0, "ignore_eos": True, "seed": i})
                    tokens[i] = data.get("tokens_predicted", 0)
                t0 = time.monotonic()
                workers = [threading.Thread(target=one, args=(i,)) for i in range(N)]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
                return time.monotonic() - t0, sum(tokens)

            def heavy_round(ids):
                seconds, data = post(f"http://127.0.0.1:{hp}/v1/completions",
                                     {"prompt": ids, "n": N, "max_tokens": NEW, "temperature": 1.0,
                                      "ignore_eos": True, "seed": 1})
                return seconds, data["usage"]["completion_tokens"]

            rng = random.Random(44)
            times = {"llama-server": [], "heavykv": []}
            for r in range(rounds):
                for name, run in (("llama-server", llama_round), ("heavykv", heavy_round)):
                    seconds, tokens = run([rng.randrange(100, 30000) for _ in range(PROMPT)])
                    times[name].append(seconds)
                    print(f"{mix} round {r} {name}: {seconds:.2f} s to the last of {N} answers "
                          f"({tokens} tokens)", flush=True)
            med = {n: statistics.median(v) for n, v in times.items()}
            print(f"{mix} median: llama-server {med['llama-server']:.2f} s, heavykv "
                  f"{med['heavykv']:.2f} s; heavykv / llama-server "
                  f"{med['heavykv'] / med['llama-server']:.3f} (target <= 0.7)")
        finally:
            for p in (llama, heavy):
                p.terminate()
                p.wait()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Batch-1 decode, heavykv against llama.cpp, alternating in one run (issue 28).

For each weight mix, ROUNDS rounds; each round runs both tools once on the same GGUF file, in
turn (A B, then B A, ...), so that a slow minute of the VM falls on both:
  llama.cpp: llama-bench -p 0 -n 64 -r 1 -t THREADS -o json        -> its tg64 tokens/s
  heavykv:   heavykv run --steps PROMPT+64 --ignore-eos --json      -> decode_tokens_per_second
Each run also records its wall time, the CPU time of its whole process (os.wait4) and the
machine's steal time over the run (/proc/stat: time the hypervisor gave our vCPUs to others);
heavykv also reports the CPU time of its decode loop alone. CPU / (wall x threads) near 1 with
no steal means the threads had their cores; steal or a low share means the VM was noisy.

After each round `heavykv_bench --benchmark_filter=^bandwidth/read/` measures the machine's read
bandwidth with the same threads (a 512 MiB buffer read over and over), so heavykv's weight
stream (the model's weight bytes, every matrix once a step, times its tokens/s) is put beside
what the memory gave in that minute.

Prints a table and writes DIR/decode-b1.json: per mix the rounds, the median tokens/s of each
tool and the ratio of the medians (and the min / max of the per-round ratios).

usage: bench_decode_b1.py LLAMA_BIN_DIR HEAVYKV_BIN DIR ROUNDS THREADS MIX...
(HEAVYKV_BIN's folder must hold heavykv_bench.)
"""
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def steal_seconds():
    # /proc/stat's first line: cpu user nice system idle iowait irq softirq steal ...
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd):
    """Runs cmd; returns its stdout and {wall_s, process_cpu_s, steal_s} over the run."""
    cpu0, steal0, t0 = children_cpu(), steal_seconds(), time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()  # reaps the child: its rusage joins RUSAGE_CHILDREN
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"bench_decode_b1: failed ({p.returncode}): {' '.join(cmd)}\n{err}")
    return out, {"wall_s": wall, "process_cpu_s": children_cpu() - cpu0,
                 "steal_s": steal_seconds() - steal0}


def run_llama(llama, model, threads, n_gen):
    out, times = timed([f"{llama}/llama-bench", "-m", model, "-p", "0", "-n", str(n_gen),
                        "-r", "1", "-t", str(threads), "-o", "json"])
    tg = next(r["avg_ts"] for r in json.loads(out) if r["n_gen"] == n_gen)
    return {"tokens_per_s": tg, **times}


def run_heavykv(hk, model, threads, n_gen, prompt_tokens):
    out, times = timed([hk, "run", "--model", model, "--prompt", "Once", "--steps",
                        str(prompt_tokens + n_gen), "--temperature", "0", "--ignore-eos",
                        "--threads", str(threads), "--json"])
    r = json.loads(out.strip().splitlines()[-1])
    return {"tokens_per_s": r["decode_tokens_per_second"], **times,
            "decode_s": r["decode_seconds"], "decode_cpu_s": r["decode_cpu_seconds"],
            "weight_gb_per_s": r["weight_bytes"] * r["decode_tokens_per_second"] / 1e9}


def read_bandwidth(hk, threads):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([os.path.join(os.path.dirname(hk), "heavykv_bench"),
                        f"--threads={threads}", "--benchmark_filter=^bandwidth/read/",
                        "--benchmark_out_format=json", f"--benchmark_out={f.name}"],
                       check=True, capture_output=True)
        return json.load(open(f.name))["benchmarks"][0]["bytes_per_second"] / 1e9


def main():
    llama, hk, bench_dir, rounds, threads = sys.argv[1:6]
    mixes = sys.argv[6:]
    rounds, threads, n_gen = int(rounds), int(threads), 64
    cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t")
    result = {"cpu": cpu,
              "threads": threads, "n_gen": n_gen, "mixes": {}}
    for mix in mixes:
        model = f"{bench_dir}/llama3.2-1b-{mix}.gguf"
        probe = json.loads(subprocess.run(
            [hk, "run", "--model", model, "--prompt", "Once", "--steps", "64", "--temperature", "0",
             "--threads", str(threads), "--json"], check=True, capture_output=True,
            text=True).stdout.strip().splitlines()[-1])
        prompt_tokens = probe["prompt_tokens"]
        runs = []
        for i in range(rounds):
            order = ["llama", "heavykv"] if i % 2 == 0 else ["heavykv", "llama"]
            pair = {}
            for who in order:
                pair[who] = (run_llama(llama, model, threads, n_gen) if who == "llama" else
                             run_heavykv(hk, model, threads, n_gen, prompt_tokens))
            pair["ratio"] = pair["heavykv"]["tokens_per_s"] / pair["llama"]["tokens_per_s"]
            pair["read_gb_per_s"] = read_bandwidth(hk, threads)
            runs.append(pair)
            h, l = pair["heavykv"], pair["llama"]
            print(f"{mix} round {i + 1}: heavykv {h['tokens_per_s']:.1f} tok/s "
                  f"(decode CPU {h['decode_cpu_s'] / (h['decode_s'] * threads):.0%} of "
                  f"{threads} threads, steal {h['steal_s']:.2f} s), llama.cpp "
                  f"{l['tokens_per_s']:.1f} (process CPU {l['process_cpu_s']:.1f} s in "
                  f"{l['wall_s']:.1f} s, steal {l['steal_s']:.2f} s): {pair['ratio']:.2f}x; "
                  f"weights {h['weight_gb_per_s']:.1f} GB/s of {pair['read_gb_per_s']:.1f} read",
                  flush=True)
        med_h = statistics.median(r["heavykv"]["tokens_per_s"] for r in runs)
        med_l = statistics.median(r["llama"]["tokens_per_s"] for r in runs)
        ratios = [r["ratio"] for r in runs]
        streams = [r["heavykv"]["weight_gb_per_s"] / r["read_gb_per_s"] for r in runs]
        result["mixes"][mix] = {
            "rounds": runs, "heavykv_median_tokens_per_s": med_h,
            "llama_median_tokens_per_s": med_l, "ratio_of_medians": med_h / med_l,
            "ratio_min": min(ratios), "ratio_max": max(ratios),
            "weights_over_read_bandwidth_median": statistics.median(streams),
            "steal_s_total": sum(r["heavykv"]["steal_s"] + r["llama"]["steal_s"] for r in runs)}
    with open(f"{bench_dir}/decode-b1.json", "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nbatch-1 decode, {threads} threads, {rounds} alternating rounds, {result['cpu']}")
    print("| mix | heavykv tok/s (median) | llama.cpp tg64 (median) | ratio | per-round range |"
          " weights / read bandwidth (median) | steal s |")
    print("|---|---|---|---|---|---|---|")
    for mix, m in result["mixes"].items():
        print(f"| {mix} | {m['heavykv_median_tokens_per_s']:.1f} | "
              f"{m['llama_median_tokens_per_s']:.1f} | {m['ratio_of_medians']:.2f} | "
              f"{m['ratio_min']:.2f}-{m['ratio_max']:.2f} | "
              f"{m['weights_over_read_bandwidth_median']:.2f} | {m['steal_s_total']:.1f} |")


if __name__ == "__main__":
    main()

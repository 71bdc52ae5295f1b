#!/usr/bin/env python3
"""scripts/route_sim.py, functionally (no timing is asserted):

1. the picker, from /metrics texts: it parses heavykv's gauges (HELP/TYPE lines, labels and all),
   picks the replica with the shortest queue and the least KV usage as the EPP's weighted queue and
   KV-cache scorers do, breaks exact ties among the best only, and refuses a page without the
   gauges it needs;
2. a tiny run end to end: two replicas of the bundled model, both policies, where every request
   must complete, round robin must split the requests evenly, each policy must report figures,
   and the picker must have read the real servers' metrics (a page it cannot parse stops the run).
"""

import argparse
import json
import os
import random
import sys
import tempfile

PAGE = """# HELP heavykv_kv_cache_usage_ratio KV pages used / pages total (0..1)
# TYPE heavykv_kv_cache_usage_ratio gauge
heavykv_kv_cache_usage_ratio {usage}
# TYPE heavykv_requests_running gauge
heavykv_requests_running 3
heavykv_requests_waiting {waiting}
heavykv_request_success_total{{finish_reason="length"}} 7
"""

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def page(waiting, usage):
    return PAGE.format(waiting=waiting, usage=usage)


def test_picker(rs):
    m = rs.parse_metrics(page(2, 0.25))
    check(m == {"waiting": 2.0, "running": 3.0, "kv_usage": 0.25}, f"parse_metrics: {m}")
    try:
        rs.parse_metrics("heavykv_requests_waiting 1\n")
        check(False, "a page without the KV gauge is refused")
    except ValueError:
        check(True, "a page without the KV gauge is refused")
    rng = random.Random(1)
    pages = lambda *rows: [rs.parse_metrics(page(w, u)) for w, u in rows]
    # Equal queues: the least KV usage wins.
    check(rs.pick(pages((0, 0.9), (0, 0.2), (0, 0.5)), rng) == 1, "equal queues: least KV usage")
    # A queue outweighs moderately more KV usage: 2*0 + 2*0.8 < 2*1 + 2*0.4.
    check(rs.pick(pages((3, 0.2), (0, 0.6)), rng) == 1, "the empty queue beats lower KV usage")
    # Queue scores are relative: min 1, max 0, linear between.
    q = rs.queue_scores(pages((4, 0), (2, 0), (0, 0)))
    check(q == [0.0, 0.5, 1.0], f"queue scores {q}")
    check(rs.kv_scores(pages((0, 1.2)))[0] == 0.0, "KV score clamped to [0, 1]")
    # Exact ties: only the tied best are drawn, and each of them is.
    drawn = {rs.pick(pages((0, 0.3), (1, 0.1), (0, 0.3)), rng) for _ in range(200)}
    check(drawn == {0, 2}, f"ties broken among the best only: {sorted(drawn)}")
    rr = rs.RoundRobin(3)
    check([rr.choose(None) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0], "round robin cycles")


def test_end_to_end(rs, args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        code = rs.main([
            "--binary", args.binary, "--model", args.model, "--tokenizer", args.tokenizer,
            "--replicas", "2", "--threads", "1", "--requests", "12", "--rate", "40",
            "--repeats", "1", "--short-prompt", "8,32", "--short-out", "4,12",
            "--long-prompt", "96,160", "--long-out", "16,32", "--long-share", "0.25",
            "--log-dir", os.path.join(tmp, "logs"), "--json", out])
        check(code == 0, f"route_sim exit code {code}")
        with open(out) as f:
            results = json.load(f)["results"]
    check([r["policy"] for r in results] == ["round-robin", "least-kv"], "both policies ran")
    for r in results:
        p = r["policy"]
        check(r["ok"] == 12 and not r["errors"], f"{p}: every request completed ({r['errors']})")
        check(sum(r["per_replica"]) == 12, f"{p}: requests per replica {r['per_replica']}")
        check(r["ttft_ms"]["p50"] > 0 and r["ttft_ms"]["p99"] >= r["ttft_ms"]["p50"],
              f"{p}: TTFT p50 {r['ttft_ms']['p50']} <= p99 {r['ttft_ms']['p99']}")
        check(r["e2e_ms"]["p99"] >= r["ttft_ms"]["p99"] > 0, f"{p}: E2E p99 >= TTFT p99")
        check(r["output_tokens_per_second"] > 0 and r["completion_tokens"] > 0,
              f"{p}: {r['completion_tokens']} tokens, {r['output_tokens_per_second']} tok/s")
    check(results[0]["per_replica"] == [6, 6], "round robin splits 12 requests 6/6")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--scripts", required=True, help="the folder of route_sim.py")
    args = ap.parse_args()
    sys.path.insert(0, args.scripts)
    import route_sim

    test_picker(route_sim)
    test_end_to_end(route_sim, args)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

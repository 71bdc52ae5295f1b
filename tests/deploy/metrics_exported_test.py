#!/usr/bin/env python3
"""Scrapes a running `heavykv serve` and proves that every metric the Grafana dashboard, the
alert rules, the prometheus-adapter rules and the inference-pool overlay's endpoint picker use is
exported, with the labels they group and filter by.

The picker (deploy/k8s/overlays/inference-pool) reads metric specs, `name` or
`name{label=value}`, from its config's engineConfigs and, in older versions, from --*-metric
flags: every one it names must be in the scrape, and the KV usage it reads must be a fraction
(0..1), since the picker scores 1 - usage.

The metric names are read from the files themselves (every heavykv_* name in the dashboard's
PromQL targets and variables, the PrometheusRule's expressions and the adapter's queries), not
from a second list. The server runs the bundled model; one streamed request with h2o eviction
makes the counters and histograms that only appear once something happened (evictions by policy,
finished requests by finish reason) show up. Labels the Prometheus Operator attaches (namespace,
pod, ...) and histogram buckets' `le` are not the server's to export. A self-test requires a
name that is not exported, and a label that is not there, to be reported.
"""

import argparse
import json
import re
import subprocess
import urllib.request

import yaml

import deploy_lib as lib

SCRAPE_LABELS = {"namespace", "pod", "instance", "job", "service", "container", "endpoint", "le"}


def expressions():
    """(source, PromQL) pairs from the dashboard, the alert rules and the adapter rules."""
    out = []
    with open(lib.path("deploy/grafana/heavykv-dashboard.json")) as f:
        dash = json.load(f)
    for p in dash["panels"]:
        out += [(f"dashboard panel '{p['title']}'", t["expr"]) for t in p.get("targets", [])]
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        if q and v.get("type") == "query":
            out.append((f"dashboard variable {v['name']}", q))
    with open(lib.path("deploy/prometheus/heavykv-rules.yaml")) as f:
        for g in yaml.safe_load(f)["spec"]["groups"]:
            out += [(f"alert {r.get('alert', r.get('record'))}", r["expr"]) for r in g["rules"]]
    with open(lib.path("deploy/prometheus/adapter-rules.yaml")) as f:
        for r in yaml.safe_load(f)["rules"]["custom"]:
            out.append((f"adapter rule {r['name']['as']}", r["seriesQuery"]))
    return out


def picker_metric_specs():
    """(source, spec) for every metric the endpoint picker is configured to read: the specs of
    its config's engineConfigs, and the value of any --*-metric flag in its args."""
    overlay = lib.path("deploy", "k8s", "overlays", "inference-pool")
    out = []
    with open(f"{overlay}/epp-config.yaml") as f:
        cfg = yaml.safe_load(f)
    for p in cfg["plugins"]:
        for engine in (p.get("parameters") or {}).get("engineConfigs", []):
            for key, spec in engine.items():
                if key.endswith("Spec") and spec:
                    out.append((f"picker engine {engine['name']} {key}", spec))
    with open(f"{overlay}/epp-deployment.yaml") as f:
        dep = yaml.safe_load(f)
    for c in dep["spec"]["template"]["spec"]["containers"]:
        for name, value in lib.split_flags(c.get("args", [])):
            if name.endswith("-metric") and value:
                out.append((f"picker flag --{name}", value.strip('"')))
    return out


def picker_missing(specs, exported):
    """What the picker's specs name that the scrape lacks: one message each."""
    problems = []
    for source, spec in specs:
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?", spec.strip())
        if not m:
            problems.append(f"{source}: cannot read the metric spec {spec!r}")
            continue
        name = m.group(1)
        if name not in exported:
            problems.append(f"{source} reads {name}, which the server does not export")
            continue
        for label in re.findall(r"([a-zA-Z_]\w*)\s*=", m.group(2) or ""):
            if label not in exported[name]:
                problems.append(f"{source} filters {name} by label {label}, which it lacks")
    return problems


def labels_used(expr):
    """Labels an expression groups by or matches on: by (...), without (...), {label=...}."""
    used = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        used |= {l.strip() for l in group.split(",") if l.strip()}
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        used |= set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    return used


def parse_exposition(text):
    """{series name: set of label names} from the Prometheus text format."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s", line)
        if m:
            labels = set(re.findall(r'([a-zA-Z_]\w*)="', m.group(2) or ""))
            series.setdefault(m.group(1), set()).update(labels)
    return series


def missing(exprs, exported):
    """What the expressions use that the scrape lacks: one message each."""
    problems = []
    for source, expr in exprs:
        names = lib.heavykv_metric_names(expr)
        for n in sorted(names):
            if n not in exported:
                problems.append(f"{source} uses {n}, which the server does not export")
        have = set().union(*(exported.get(n, set()) for n in names)) if names else set()
        for label in sorted(labels_used(expr) - SCRAPE_LABELS):
            if names and label not in have:
                problems.append(f"{source} uses label {label}, which none of "
                                f"{sorted(names)} carries")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    args = ap.parse_args()
    exprs = expressions()
    names = set().union(*(lib.heavykv_metric_names(e) for _, e in exprs))
    errors = lib.Errors()
    errors.check(len(names) >= 10, f"only {len(names)} metric names found in the deploy files")
    with lib.Server(args.binary, ["--model", lib.path("models/stories260K.bin"),
                                  "--tokenizer", lib.path("models/tok512.bin"),
                                  "--kv-pages", "256"], env=lib.IMAGE_ENV) as server:
        gen = subprocess.run(
            [args.binary, "generate", "--server", f"127.0.0.1:{server.port}", "--temperature",
             "0", "--max-tokens", "48", "--policy", "h2o", "--kv-budget", "16",
             "Once upon a time"], capture_output=True, text=True, timeout=60)
        errors.check(gen.returncode == 0, f"heavykv generate failed: {gen.stderr}")
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                    timeout=10) as r:
            text = r.read().decode()
            exported = parse_exposition(text)
    errors.check(exported.get("heavykv_kv_tokens_evicted_total") == {"policy"},
                 "the h2o request evicted nothing: evictions by policy cannot be checked")
    for p in missing(exprs, exported):
        errors.add(p)
    specs = picker_metric_specs()
    errors.check(len(specs) >= 3, f"only {len(specs)} metric specs found in the picker's config "
                 "(queue, running, KV usage)")
    for p in picker_missing(specs, exported):
        errors.add(p)
    usage = re.findall(r"^heavykv_kv_cache_usage_ratio(?:\{[^}]*\})? (\S+)$", text, re.M)
    errors.check(len(usage) == 1 and 0 <= float(usage[0]) <= 1,
                 f"heavykv_kv_cache_usage_ratio {usage} is not one fraction in [0, 1]")
    # Self-test: a name that is not exported and a label that is not there are reported.
    bogus = [("self-test", "rate(heavykv_definitely_not_exported_total[5m])"),
             ("self-test", "sum by (policy) (heavykv_requests_waiting)")]
    errors.check(len(missing(bogus, exported)) == 2, "the self-test's bogus uses were not reported")
    bogus = [("self-test", "vllm:num_requests_waiting"),
             ("self-test", "heavykv_requests_waiting{policy=h2o}")]
    errors.check(len(picker_missing(bogus, exported)) == 2,
                 "the self-test's bogus picker specs were not reported")
    print(f"{len(names)} metric names, {len(exprs)} expressions and {len(specs)} picker metric "
          "specs checked against the scrape")
    errors.exit("metrics_exported_test")


if __name__ == "__main__":
    main()

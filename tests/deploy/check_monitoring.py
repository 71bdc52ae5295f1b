#!/usr/bin/env python3
"""Checks the dashboard, the alert rules and the prometheus-adapter rules with Debian's promtool.

What it proves:
- deploy/prometheus/heavykv-rules.yaml (a PrometheusRule) holds valid rules (`promtool check
  rules` on its spec.groups) that behave as intended: `promtool test rules` runs
  heavykv-rules.test.yaml, which drives each alert (cache above 95% for 5 minutes, the waiting
  queue growing, the error rate, preemptions) through series that must and must not fire it;
- deploy/grafana/heavykv-dashboard.json parses, every panel has a unique id, a place on the grid,
  the $datasource variable and at least one PromQL target, every PromQL expression parses
  (promtool checks them as recording rules, the Grafana variables substituted), and the panels
  the operations guide promises are there (cache occupancy, pages used of total, evicted tokens
  per second by policy, running and waiting requests, TTFT and inter-token quantiles, generated
  tokens per second);
- every adapter rule's seriesQuery and metricsQuery parse and expose namespace and pod.
(Whether the server exports every metric used here is tests/deploy/metrics_exported_test.py.)
A self-test breaks each file and requires each break to be reported.
"""

import argparse
import copy
import json
import os
import re
import subprocess
import tempfile

import yaml

import deploy_lib as lib

GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$namespace": "ns", "$pod": ".*",
                "${datasource}": "prometheus"}

# The panels the operations guide promises: (what, predicate over one panel's exprs).
REQUIRED_PANELS = [
    ("cache occupancy", lambda e: "heavykv_kv_cache_usage_ratio" in e),
    ("pages used of total", lambda e: "heavykv_kv_pages_used" in e and "heavykv_kv_pages_total"
     in e),
    ("evicted tokens per second by policy", lambda e: re.search(
        r"by \(policy\) \(rate\(heavykv_kv_tokens_evicted_total", e)),
    ("running and waiting requests", lambda e: "heavykv_requests_running" in e and
     "heavykv_requests_waiting" in e),
    ("TTFT quantiles", lambda e: len(re.findall(
        r"histogram_quantile\(0\.\d+, [^\n]*heavykv_time_to_first_token_seconds_bucket", e)) >= 2),
    ("inter-token latency quantiles", lambda e: len(re.findall(
        r"histogram_quantile\(0\.\d+, [^\n]*heavykv_inter_token_latency_seconds_bucket", e)) >= 2),
    ("generated tokens per second", lambda e: "rate(heavykv_generation_tokens_total" in e),
    ("prefix cache hit ratio", lambda e: "heavykv_prefix_cache_hits_total" in e and
     "heavykv_prefix_cache_lookups_total" in e),
    ("prefix cache pages", lambda e: "heavykv_prefix_cache_cached_pages" in e),
]


def substitute(expr):
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    return expr


def promtool_parse(promtool, exprs, errors, what):
    """Each expression must parse: checked as recording rules by `promtool check rules`."""
    if not exprs:
        return
    rules = {"groups": [{"name": "parse", "rules": [
        {"record": f"heavykv_check:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "parse.yml")
        with open(f, "w") as fh:
            yaml.safe_dump(rules, fh)
        r = subprocess.run([promtool, "check", "rules", f], capture_output=True, text=True)
    errors.check(r.returncode == 0, f"{what}: PromQL does not parse:\n{r.stdout}{r.stderr}")


def check_dashboard(dash, promtool, errors):
    errors.check(dash.get("uid") and dash.get("title"), "the dashboard needs a uid and a title")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    errors.check(variables.get("datasource", {}).get("type") == "datasource",
                 "the dashboard needs a $datasource variable of type datasource")
    exprs, ids = [], set()
    for v in variables.values():
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        m = re.fullmatch(r"label_values\((.+),\s*\w+\)", q)
        if v["type"] == "query":
            if errors.check(m, f"variable {v['name']}: expected label_values(SELECTOR, label)"):
                exprs.append(substitute(m.group(1)))
    panels = dash.get("panels", [])
    errors.check(panels, "the dashboard has no panels")
    per_panel = []
    for p in panels:
        title = p.get("title", f"panel {p.get('id')}")
        errors.check(p.get("id") not in ids, f"{title}: panel id {p.get('id')} is not unique")
        ids.add(p.get("id"))
        errors.check(all(k in p.get("gridPos", {}) for k in "hwxy"), f"{title}: no gridPos")
        errors.check(p.get("datasource", {}).get("uid") == "${datasource}",
                     f"{title}: use the $datasource variable")
        targets = [t for t in p.get("targets", []) if t.get("expr", "").strip()]
        errors.check(targets, f"{title}: no PromQL target")
        errors.check(len({t.get("refId") for t in targets}) == len(targets),
                     f"{title}: refIds are not unique")
        per_panel.append("\n".join(t["expr"] for t in targets))
        exprs += [substitute(t["expr"]) for t in targets]
    for what, pred in REQUIRED_PANELS:
        errors.check(any(pred(e) for e in per_panel), f"no panel shows {what}")
    promtool_parse(promtool, exprs, errors, "dashboard")


def check_rules(rule_doc, test_text, promtool, errors):
    errors.check(rule_doc.get("kind") == "PrometheusRule",
                 "heavykv-rules.yaml: not a PrometheusRule")
    groups = rule_doc.get("spec", {}).get("groups", [])
    alerts = {r["alert"]: r for g in groups for r in g.get("rules", []) if "alert" in r}
    for name, metric in (("HeavykvKvCacheFull", "heavykv_kv_cache_usage_ratio"),
                         ("HeavykvWaitingQueueGrowing", "heavykv_requests_waiting"),
                         ("HeavykvErrorRate", "heavykv_request_success_total"),
                         ("HeavykvPreempting", "heavykv_preemptions_total")):
        errors.check(name in alerts and metric in alerts[name]["expr"],
                     f"no alert {name} on {metric}")
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "heavykv-rules.yml"), "w") as f:
            yaml.safe_dump({"groups": groups}, f)
        with open(os.path.join(d, "heavykv-rules.test.yaml"), "w") as f:
            f.write(test_text)
        for cmd in (["check", "rules", "heavykv-rules.yml"],
                    ["test", "rules", "heavykv-rules.test.yaml"]):
            r = subprocess.run([promtool, *cmd], cwd=d, capture_output=True, text=True)
            errors.check(r.returncode == 0,
                         f"promtool {' '.join(cmd[:2])} failed:\n{r.stdout}{r.stderr}")


def check_adapter(adapter, promtool, errors):
    rules = adapter.get("rules", {}).get("custom", [])
    errors.check(rules, "adapter-rules.yaml: no rules.custom")
    exprs = []
    for r in rules:
        name = r.get("name", {}).get("as", "?")
        over = r.get("resources", {}).get("overrides", {})
        errors.check(over.get("namespace", {}).get("resource") == "namespace" and
                     over.get("pod", {}).get("resource") == "pod",
                     f"adapter rule {name}: map the namespace and pod labels to resources")
        mq = r.get("metricsQuery", "")
        errors.check("<<.Series>>" in mq and "<<.LabelMatchers>>" in mq,
                     f"adapter rule {name}: metricsQuery needs <<.Series>> and <<.LabelMatchers>>")
        series = lib.heavykv_metric_names(r.get("seriesQuery", ""))
        errors.check(series == {name}, f"adapter rule {name}: seriesQuery must select {name}")
        exprs.append(r.get("seriesQuery", ""))
        exprs.append(mq.replace("<<.Series>>", name)
                     .replace("<<.LabelMatchers>>", 'namespace="ns",pod=~"p-.*"')
                     .replace("<<.GroupBy>>", "pod"))
    promtool_parse(promtool, exprs, errors, "adapter rules")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--promtool", required=True)
    args = ap.parse_args()
    lib.require_tool(args.promtool, "promtool (Debian package prometheus)")
    with open(lib.path("deploy/grafana/heavykv-dashboard.json")) as f:
        dash = json.load(f)
    with open(lib.path("deploy/prometheus/heavykv-rules.yaml")) as f:
        rules = yaml.safe_load(f)
    with open(lib.path("deploy/prometheus/heavykv-rules.test.yaml")) as f:
        rules_test = f.read()
    with open(lib.path("deploy/prometheus/adapter-rules.yaml")) as f:
        adapter = yaml.safe_load(f)
    errors = lib.Errors()
    errors.context = "deploy/grafana/heavykv-dashboard.json"
    check_dashboard(dash, args.promtool, errors)
    errors.context = "deploy/prometheus/heavykv-rules.yaml"
    check_rules(rules, rules_test, args.promtool, errors)
    errors.context = "deploy/prometheus/adapter-rules.yaml"
    check_adapter(adapter, args.promtool, errors)

    errors.context = "self-test"
    broken_dash = []
    d = copy.deepcopy(dash)
    d["panels"][0]["targets"] = []
    broken_dash.append(("a panel without targets", d))
    d = copy.deepcopy(dash)
    d["panels"][1]["targets"][0]["expr"] += " by"
    broken_dash.append(("a PromQL syntax error", d))
    d = copy.deepcopy(dash)
    d["panels"] = [p for p in d["panels"] if "policy" not in json.dumps(p)]
    broken_dash.append(("no eviction panel", d))
    for name, d in broken_dash:
        probe = lib.Errors()
        check_dashboard(d, args.promtool, probe)
        errors.check(probe.items, f"a dashboard with {name} was not reported")
    r = copy.deepcopy(rules)
    r["spec"]["groups"][0]["rules"][0]["for"] = "4m"  # fires a minute early: the test must see it
    s = copy.deepcopy(rules)
    s["spec"]["groups"][0]["rules"][0]["expr"] = s["spec"]["groups"][0]["rules"][0]["expr"] \
        .replace("0.95", "0.99")
    for name, rr in (("for 4m", r), ("threshold 0.99", s)):
        probe = lib.Errors()
        check_rules(rr, rules_test, args.promtool, probe)
        errors.check(probe.items, f"cache alert with {name} was not reported by promtool test")
    a = copy.deepcopy(adapter)
    a["rules"]["custom"][0]["metricsQuery"] = "avg_over_time(<<.Series>>[2m])"
    probe = lib.Errors()
    check_adapter(a, args.promtool, probe)
    errors.check(probe.items, "an adapter rule without <<.LabelMatchers>> was not reported")
    errors.exit("check_monitoring")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Renders deploy/k8s/overlays/inference-pool with `kubectl kustomize` and checks that its
pieces fit together, as the Gateway API Inference Extension v1.5.0 reads them, so that routing
works on the first apply:

- the InferencePool selects the heavykv server pods (and not the picker's), and its one target
  port is the container port named http, the one `--http-address` binds;
- its endpointPickerRef names a Service that selects the picker's pods, on a port that reaches
  the picker's ext-proc port (--grpc-port); the picker's args name the pool (--pool-name,
  --pool-group from the pool's apiVersion), scrape the port `--metrics-address` binds
  (--model-server-metrics-port), and pass none of the --*-metric flags, which v1.5.0 refuses at
  start-up; its probes use --grpc-health-port; its image is the version DEPLOY.md names;
- --config-file is a key of the ConfigMap mounted at that path, an EndpointPickerConfig whose
  plugins are v1.5.0 types with parameters those types read (Go's JSON decoding ignores unknown
  keys, so a misspelt parameter would be silently dropped), whose profile and data layer refer
  to configured plugins, whose metric names are heavykv's (the scrape itself is checked by
  metrics_exported_test.py), and whose prefix blocks are heavykv's --block-size, with an index
  capacity equal to the 16-token blocks one pod's pool holds (`heavykv plan`);
- the picker's service account is bound to a Role that reads pods and inferencepools;
- the HTTPRoute sends to the pool and hangs off a rendered Gateway with an HTTP listener;
- the picker's ServiceMonitor scrapes only the picker's Service, and heavykv's does not;
- heavykv's NetworkPolicy admits the picker on the metrics port (it scrapes every 50 ms), and
  the picker's admits the gateway on ext-proc;
- the picker's grace period is at least the heavykv pods'.
A self-test breaks the rendered manifests in each of these ways and requires each to be reported.
"""

import argparse
import copy
import json
import re
import subprocess

import yaml

import deploy_lib as lib

OVERLAY = "inference-pool"
EPP_VERSION = "v1.5.0"
EPP_IMAGE = f"registry.k8s.io/gateway-api-inference-extension/epp:{EPP_VERSION}"
POOL_GROUP = "inference.networking.k8s.io"
# The metric flags v1.5.0 marks deprecated and refuses when set (pkg/epp/server/options.go).
REFUSED_FLAGS = {"total-queued-requests-metric", "total-running-requests-metric",
                 "kv-cache-usage-percentage-metric", "lora-info-metric", "cache-info-metric"}
# Plugin types this overlay may configure, with the parameters v1.5.0 reads for each (the JSON
# names of its Go config structs).
PLUGIN_PARAMS = {
    "queue-scorer": set(),
    "kv-cache-utilization-scorer": set(),
    "max-score-picker": {"maxNumOfEndpoints"},
    "prefix-cache-scorer": {"autoTune", "blockSizeTokens", "blockSize", "maxPrefixBlocksToMatch",
                            "maxPrefixTokensToMatch", "lruCapacityPerServer"},
    "metrics-data-source": {"scheme", "path", "insecureSkipVerify"},
    "core-metrics-extractor": {"engineLabelKey", "defaultEngine", "engineConfigs"},
}
ENGINE_KEYS = {"name", "queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec",
               "cacheInfoSpec", "cacheBlockSizeLabelName", "cacheNumBlocksLabelName",
               "cacheBlockSizeSpec", "cacheNumBlocksSpec"}
CONFIG_KEYS = {"apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles",
               "saturationDetector", "dataLayer", "flowControl", "parser"}


def named(docs, kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found[0] if len(found) == 1 else None


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def port_of(address):
    return int(address.rpartition(":")[2])


def pod_labels(dep):
    return dep["spec"]["template"]["metadata"].get("labels", {})


def container_args(dep, docs):
    """{flag: value} of a Deployment's first container, $(VAR)s replaced from its env and the
    ConfigMaps it takes env from."""
    c = dep["spec"]["template"]["spec"]["containers"][0]
    env = {}
    for ref in c.get("envFrom", []):
        cm = named(docs, "ConfigMap", ref.get("configMapRef", {}).get("name"))
        env.update(cm.get("data", {}) if cm else {})
    for e in c.get("env", []):
        env[e["name"]] = e.get("value", f"<{e['name']}>")
    flags = {}
    for name, value in lib.split_flags(c.get("args", [])):
        flags[name] = re.sub(r"\$\((\w+)\)", lambda m: str(env.get(m.group(1), m.group(0))),
                             value or "")
    return flags


def service_target(docs, svc, port, dep):
    """The container port number of DEP that port PORT (a number) of Service SVC reaches, or
    None."""
    c = dep["spec"]["template"]["spec"]["containers"][0]
    cports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    for p in svc["spec"].get("ports", []):
        if p["port"] == port:
            t = p.get("targetPort", p["port"])
            return cports.get(t, t if isinstance(t, int) else None)
    return None


def check_epp_config(cfg, flags, ctx, errors):
    """The EndpointPickerConfig: v1.5.0's plugin types and parameters, references, heavykv's
    block size and pool."""
    errors.check(cfg.get("kind") == "EndpointPickerConfig", "the picker's config file is not an "
                 "EndpointPickerConfig")
    for key in sorted(set(cfg) - CONFIG_KEYS):
        errors.add(f"picker config: unknown key {key}")
    plugins = {}
    for p in cfg.get("plugins", []):
        t = p.get("type")
        if not errors.check(t in PLUGIN_PARAMS, f"picker config: plugin type {t} is not one this "
                            f"overlay knows v1.5.0's parameters of"):
            continue
        plugins[p.get("name", t)] = p
        for key in sorted(set(p.get("parameters") or {}) - PLUGIN_PARAMS[t]):
            errors.add(f"picker config: {t} has no parameter {key} (v1.5.0 would ignore it)")
    refs = [r.get("pluginRef") for prof in cfg.get("schedulingProfiles", [])
            for r in prof.get("plugins", [])]
    for src in (cfg.get("dataLayer") or {}).get("sources", []):
        refs.append(src.get("pluginRef"))
        refs += [x.get("pluginRef") for x in src.get("extractors", [])]
    for r in refs:
        errors.check(r in plugins, f"picker config refers to plugin {r}, which it does not define")
    types = {p["type"] for p in plugins.values()}
    for t in ("prefix-cache-scorer", "kv-cache-utilization-scorer", "queue-scorer",
              "metrics-data-source", "core-metrics-extractor"):
        errors.check(t in types, f"picker config: no {t}")

    prefix = next((p.get("parameters") or {} for p in plugins.values()
                   if p["type"] == "prefix-cache-scorer"), {})
    block = int(flags.get("block-size", 16))
    errors.check(prefix.get("autoTune") is False, "prefix-cache-scorer: set autoTune: false "
                 "(heavykv exports no cache_config_info; say the block size instead)")
    errors.check(prefix.get("blockSizeTokens") == block, f"prefix-cache-scorer blockSizeTokens "
                 f"{prefix.get('blockSizeTokens')} is not heavykv's --block-size {block}")
    errors.check(prefix.get("lruCapacityPerServer") == ctx["pool_blocks"],
                 f"prefix-cache-scorer lruCapacityPerServer {prefix.get('lruCapacityPerServer')} "
                 f"is not the {ctx['pool_blocks']} blocks of one pod's pool (heavykv plan)")

    ext = next((p.get("parameters") or {} for p in plugins.values()
                if p["type"] == "core-metrics-extractor"), {})
    engines = {e.get("name"): e for e in ext.get("engineConfigs", [])}
    for e in engines.values():
        for key in sorted(set(e) - ENGINE_KEYS):
            errors.add(f"core-metrics-extractor engine {e.get('name')}: unknown key {key}")
    engine = engines.get(ext.get("defaultEngine"))
    if errors.check(engine is not None, "core-metrics-extractor: defaultEngine must be one of "
                    "its engineConfigs (else unlabelled heavykv pods are read as vLLM)"):
        for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"):
            spec = engine.get(key, "")
            errors.check(str(spec).startswith("heavykv_"),
                         f"core-metrics-extractor {key} {spec!r} is not a heavykv metric")
        for key in ("loraSpec", "cacheInfoSpec"):
            errors.check(not engine.get(key), f"core-metrics-extractor {key} must be empty: "
                         "heavykv has no LoRA adapters and no cache_config_info gauge, and v1.5.0 "
                         "counts a named metric missing from the scrape as an error")


def check(docs, ctx, errors):
    dep, epp = named(docs, "Deployment", "heavykv"), named(docs, "Deployment", "heavykv-epp")
    pool = [d for d in docs if d["kind"] == "InferencePool"]
    if not (errors.check(dep and epp, "the heavykv and heavykv-epp Deployments must be rendered")
            and errors.check(len(pool) == 1, f"expected one InferencePool, found {len(pool)}")):
        return
    pool, spec = pool[0], pool[0]["spec"]
    server, picker = pod_labels(dep), pod_labels(epp)
    flags, eflags = container_args(dep, docs), container_args(epp, docs)
    hk = dep["spec"]["template"]["spec"]["containers"][0]
    cports = {p["name"]: p["containerPort"] for p in hk.get("ports", [])}

    # The pool.
    sel = spec.get("selector", {}).get("matchLabels")
    errors.check(selects(sel, server), "the InferencePool does not select the heavykv pods")
    errors.check(not selects(sel, picker), "the InferencePool selects the picker's pods")
    http = port_of(flags.get("http-address", ":0"))
    targets = [p.get("number") for p in spec.get("targetPorts", [])]
    errors.check(targets == [http] and cports.get("http") == http,
                 f"the InferencePool targets {targets}, not the http container port that "
                 f"--http-address binds ({http})")
    errors.check(pool["apiVersion"] == f"{POOL_GROUP}/v1", f"the InferencePool is "
                 f"{pool['apiVersion']}, not the GA {POOL_GROUP}/v1")

    # The picker the pool names.
    ref = spec.get("endpointPickerRef", {})
    svc = named(docs, "Service", ref.get("name"))
    grpc = int(eflags.get("grpc-port", 9002))
    if errors.check(ref.get("kind", "Service") == "Service" and svc is not None,
                    f"endpointPickerRef names Service {ref.get('name')}, which is not rendered"):
        errors.check(selects(svc["spec"].get("selector"), picker),
                     f"Service {svc['metadata']['name']} does not select the picker's pods")
        errors.check(service_target(docs, svc, ref.get("port", {}).get("number"), epp) == grpc,
                     f"endpointPickerRef port {ref.get('port')} does not reach the picker's "
                     f"ext-proc port {grpc}")
    errors.check(eflags.get("pool-name") == pool["metadata"]["name"],
                 f"the picker's --pool-name {eflags.get('pool-name')} is not the pool")
    errors.check(eflags.get("pool-group", POOL_GROUP) == POOL_GROUP,
                 f"the picker's --pool-group is not {POOL_GROUP}")
    metrics = port_of(flags.get("metrics-address", ":0"))
    scraped = eflags.get("model-server-metrics-port")
    errors.check(scraped == str(metrics),
                 f"the picker's --model-server-metrics-port {scraped} is not heavykv's "
                 f"--metrics-address port {metrics}: it would scrape the "
                 "pool's target port, where heavykv serves no /metrics")
    for f in sorted(REFUSED_FLAGS & set(eflags)):
        errors.add(f"the picker's --{f}: v1.5.0 refuses it at start-up; name metrics in the "
                   "config's engineConfigs")
    ec = epp["spec"]["template"]["spec"]["containers"][0]
    eports = {p["containerPort"] for p in ec.get("ports", [])}
    errors.check(grpc in eports, f"the picker's ext-proc port {grpc} is not a container port")
    health = int(eflags.get("grpc-health-port", 9003))
    for probe in ("livenessProbe", "readinessProbe"):
        errors.check(ec.get(probe, {}).get("grpc", {}).get("port") == health,
                     f"the picker's {probe} is not a gRPC probe on --grpc-health-port {health}")
    errors.check(ec.get("image") == EPP_IMAGE, f"the picker's image {ec.get('image')} is not "
                 f"{EPP_IMAGE}, the version docs/DEPLOY.md and this check are written for")
    errors.check(EPP_IMAGE in ctx["deploy_md"], f"docs/DEPLOY.md does not name {EPP_IMAGE}")
    grace = dep["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    errors.check(epp["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30) >= grace,
                 f"the picker's terminationGracePeriodSeconds must be at least heavykv's {grace}")

    # Its configuration file.
    mount, _, key = eflags.get("config-file", "").rpartition("/")
    cm = None
    for m in ec.get("volumeMounts", []):
        if m["mountPath"].rstrip("/") == mount:
            vol = next((v for v in epp["spec"]["template"]["spec"].get("volumes", [])
                        if v["name"] == m["name"]), {})
            cm = named(docs, "ConfigMap", vol.get("configMap", {}).get("name"))
    if errors.check(cm is not None and key in cm.get("data", {}), f"--config-file "
                    f"{eflags.get('config-file')} is not a key of a mounted ConfigMap"):
        check_epp_config(yaml.safe_load(cm["data"][key]), flags, ctx, errors)

    # RBAC.
    sa = epp["spec"]["template"]["spec"].get("serviceAccountName", "default")
    errors.check(named(docs, "ServiceAccount", sa) is not None,
                 f"the picker's service account {sa} is not rendered")
    granted = set()
    for rb in (d for d in docs if d["kind"] == "RoleBinding"):
        if any(s.get("kind") == "ServiceAccount" and s.get("name") == sa
               for s in rb.get("subjects", [])):
            role = named(docs, rb["roleRef"]["kind"], rb["roleRef"]["name"])
            for rule in (role or {}).get("rules", []):
                if {"get", "list", "watch"} <= set(rule.get("verbs", [])):
                    granted |= {(g, r) for g in rule.get("apiGroups", [])
                                for r in rule.get("resources", [])}
    for need in (("", "pods"), (POOL_GROUP, "inferencepools")):
        errors.check(need in granted, f"the picker's service account may not get/list/watch "
                     f"{need[1]}")

    # Gateway and route.
    routes = [d for d in docs if d["kind"] == "HTTPRoute"]
    to_pool = [r for r in routes for rule in r["spec"].get("rules", [])
               for b in rule.get("backendRefs", [])
               if (b.get("group"), b.get("kind"), b.get("name")) ==
               (POOL_GROUP, "InferencePool", pool["metadata"]["name"])]
    if errors.check(to_pool, "no HTTPRoute sends to the InferencePool"):
        for p in to_pool[0]["spec"].get("parentRefs", []):
            gw = named(docs, p.get("kind", "Gateway"), p["name"])
            errors.check(gw is not None and any(l.get("protocol") in ("HTTP", "HTTPS")
                                                for l in gw["spec"].get("listeners", [])),
                         f"the HTTPRoute's parent {p['name']} is not a rendered Gateway with an "
                         "HTTP listener")

    # Scraping.
    services = [d for d in docs if d["kind"] == "Service"]
    for sm in (d for d in docs if d["kind"] == "ServiceMonitor"):
        picked = [s for s in services if selects(sm["spec"]["selector"].get("matchLabels"),
                                                 s["metadata"].get("labels", {}))]
        is_epp = any(s["metadata"]["name"] == svc["metadata"]["name"] for s in picked) if svc \
            else False
        if sm["metadata"]["name"] == "heavykv-epp":
            if errors.check(len(picked) == 1 and is_epp, "the picker's ServiceMonitor must select "
                            "exactly the picker's Service"):
                for ep in sm["spec"].get("endpoints", []):
                    port = next((p for p in picked[0]["spec"]["ports"]
                                 if p.get("name") == ep.get("port")), None)
                    errors.check(port is not None and service_target(docs, picked[0], port["port"],
                                                                      epp) ==
                                 int(eflags.get("metrics-port", 9090)),
                                 f"the picker's ServiceMonitor port {ep.get('port')} does not "
                                 "reach the picker's --metrics-port")
        else:
            errors.check(not is_epp, f"ServiceMonitor {sm['metadata']['name']} also scrapes the "
                         "picker's Service")

    # Network policies.
    def admitted(np_name, port_number, cport_names, peer_ok):
        np = named(docs, "NetworkPolicy", np_name)
        for rule in (np or {}).get("spec", {}).get("ingress", []):
            ports = [cport_names.get(p.get("port"), p.get("port")) for p in rule.get("ports", [])]
            if port_number in ports and any(peer_ok(peer) for peer in rule.get("from", [])):
                return True
        return False
    errors.check(admitted("heavykv", metrics, cports, lambda peer: "namespaceSelector" not in peer
                          and selects(peer.get("podSelector", {}).get("matchLabels"), picker)),
                 "heavykv's NetworkPolicy does not admit the picker's pods on the metrics port")
    epp_ports = {p["name"]: p["containerPort"] for p in ec.get("ports", [])}
    errors.check(admitted("heavykv-epp", grpc, epp_ports, lambda peer: True),
                 "the picker's NetworkPolicy does not admit the gateway on ext-proc")


def breakages(docs):
    """(name, broken copy of docs) pairs that check() must report."""
    def kind(d, k, name=None):
        return next(x for x in d if x["kind"] == k and name in (None, x["metadata"]["name"]))

    def epp(d):
        return kind(d, "Deployment", "heavykv-epp")["spec"]["template"]["spec"]

    def epp_config(d, edit):
        cm = next(x for x in d if x["kind"] == "ConfigMap" and "epp-config.yaml" in x["data"])
        cfg = yaml.safe_load(cm["data"]["epp-config.yaml"])
        edit(cfg)
        cm["data"]["epp-config.yaml"] = yaml.safe_dump(cfg)

    def plugin(cfg, t):
        return next(p for p in cfg["plugins"] if p["type"] == t)

    def engine(cfg):
        return plugin(cfg, "core-metrics-extractor")["parameters"]["engineConfigs"][0]

    def set_arg(d, flag, value):
        args = epp(d)["containers"][0]["args"]
        args[:] = [a for a in args if not a.startswith(f"--{flag}=")] + [f"--{flag}={value}"]

    pool = lambda d: kind(d, "InferencePool")["spec"]  # noqa: E731
    edits = {
        "pool selector": lambda d: pool(d)["selector"]["matchLabels"].update(
            {"app.kubernetes.io/component": "model-server"}),
        "pool target port": lambda d: pool(d)["targetPorts"][0].update(number=50051),
        "picker Service name": lambda d: pool(d)["endpointPickerRef"].update(name="epp"),
        "picker port": lambda d: pool(d)["endpointPickerRef"]["port"].update(number=9003),
        "--pool-name": lambda d: set_arg(d, "pool-name", "llama"),
        "metrics port": lambda d: set_arg(d, "model-server-metrics-port", "8000"),
        "refused metric flag": lambda d: set_arg(d, "kv-cache-usage-percentage-metric",
                                                 "heavykv_kv_cache_usage_ratio"),
        "config file path": lambda d: set_arg(d, "config-file", "/config/default-plugins.yaml"),
        "image version": lambda d: epp(d)["containers"][0].update(
            image="registry.k8s.io/gateway-api-inference-extension/epp:v1.4.0"),
        "short picker grace": lambda d: epp(d).update(terminationGracePeriodSeconds=5),
        "prefix block size": lambda d: epp_config(d, lambda c: plugin(
            c, "prefix-cache-scorer")["parameters"].update(blockSizeTokens=64)),
        "prefix capacity": lambda d: epp_config(d, lambda c: plugin(
            c, "prefix-cache-scorer")["parameters"].update(lruCapacityPerServer=31250)),
        "misspelt parameter": lambda d: epp_config(d, lambda c: plugin(
            c, "prefix-cache-scorer")["parameters"].update(blockSizeToken=16)),
        "profile refers to nothing": lambda d: epp_config(d, lambda c: c["schedulingProfiles"][0]
                                                          ["plugins"].append({"pluginRef": "x"})),
        "vLLM queue metric": lambda d: epp_config(d, lambda c: engine(c).update(
            queuedRequestsSpec="vllm:num_requests_waiting")),
        "vLLM LoRA metric": lambda d: epp_config(d, lambda c: engine(c).update(
            loraSpec="vllm:lora_requests_info")),
        "default engine": lambda d: epp_config(d, lambda c: plugin(
            c, "core-metrics-extractor")["parameters"].update(defaultEngine="vllm")),
        "RBAC subject": lambda d: kind(d, "RoleBinding")["subjects"][0].update(name="default"),
        "route to a Service": lambda d: kind(d, "HTTPRoute")["spec"]["rules"][0]["backendRefs"][0]
        .update(group="", kind="Service"),
        "route parent": lambda d: kind(d, "HTTPRoute")["spec"]["parentRefs"][0].update(name="gw"),
        "picker ServiceMonitor port": lambda d: kind(d, "ServiceMonitor", "heavykv-epp")["spec"]
        ["endpoints"][0].update(port="metrics"),
        "heavykv ServiceMonitor scrapes the picker": lambda d: kind(d, "Service", "heavykv-epp")
        ["metadata"]["labels"].update(kind(d, "Service", "heavykv")["metadata"]["labels"]),
        "picker not admitted to metrics": lambda d: kind(d, "NetworkPolicy", "heavykv")["spec"]
        ["ingress"].pop(2),
        "ext-proc not admitted": lambda d: kind(d, "NetworkPolicy", "heavykv-epp")["spec"]
        ["ingress"].pop(0),
    }
    for name, edit in edits.items():
        broken = copy.deepcopy(docs)
        edit(broken)
        yield name, broken


def pool_blocks(binary, docs):
    """The 16-token blocks one heavykv pod's KV pool holds, from `heavykv plan` with the
    rendered flags: a page holds block_size tokens of one layer on the CPU, of every layer on a
    GPU."""
    flags = container_args(named(docs, "Deployment", "heavykv"), docs)
    model = lib.path("models", flags["model"].rpartition("/")[2])
    r = subprocess.run([binary, "plan", "--model", model, "--kv-pool-mb", flags["kv-pool-mb"],
                        "--block-size", flags["block-size"], "--device", flags["device"],
                        "--json"], capture_output=True, text=True, check=True)
    plan = json.loads(r.stdout)
    return plan["pages"] // plan["layers"] if flags["device"] == "cpu" else plan["pages"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubectl", required=True)
    ap.add_argument("--binary", required=True)
    args = ap.parse_args()
    lib.require_tool(args.kubectl, "kubectl")
    errors = lib.Errors()
    errors.context = f"overlays/{OVERLAY}"
    docs = lib.render(args.kubectl, OVERLAY)
    with open(lib.path("docs", "DEPLOY.md")) as f:
        ctx = {"deploy_md": f.read(), "pool_blocks": pool_blocks(args.binary, docs)}
    check(docs, ctx, errors)
    errors.context = f"overlays/{OVERLAY} self-test"
    before = lib.Errors()
    check(docs, ctx, before)
    for name, broken in breakages(docs):
        probe = lib.Errors()
        check(broken, ctx, probe)
        errors.check(set(probe.items) - set(before.items), f"breaking '{name}' was not reported")
    errors.exit("check_inference_pool")


if __name__ == "__main__":
    main()

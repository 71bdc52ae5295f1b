#!/usr/bin/env python3
"""Renders deploy/k8s/overlays/{cpu,gpu} with `kubectl kustomize` and checks what a cluster
would only tell you after a failed rollout:

- every Service, the PodDisruptionBudget and the Deployment's own selector select the pod
  template's labels, and every Service port targets a real container port;
- the readiness, liveness and startup probes are native gRPC probes on the port `--listen` binds;
- the ServiceMonitor selects exactly one Service that has its port, which targets the port
  `--metrics-address` binds, at /metrics;
- every ConfigMap key is a `heavykv serve` flag that the container's args pass as $(KEY), every
  $(VAR) in the args is defined, the flags parse (`heavykv serve ARGS --help`), and the server
  starts with them (the model paths mapped to the repo's models/, the pool made small);
- the HPA scales the Deployment (which leaves `replicas` to it) on a metric that
  deploy/prometheus/adapter-rules.yaml exposes;
- zero-drop rollouts: maxUnavailable 0, maxSurge >= 1, terminationGracePeriodSeconds > preStop
  sleep + --grace + 1 s; the PDB never blocks the minimum replica count;
- resources: on the CPU the memory limit holds --kv-pool-mb + the model + 256 MiB; --threads is
  the CPU request; --device cuda goes with an nvidia.com/gpu limit (and only it), a node selector
  and a toleration;
- runAsUser is the Dockerfile's USER and the image carries the overlay's tag;
- the OpenAI HTTP port `--http-address` binds is a container port named http;
- a NetworkPolicy selects the pods and admits the gRPC, HTTP and metrics ports, the metrics
  port only from the monitoring namespace; the args keep server reflection off;
- the dashboard and alert rules shipped in the overlays are the files in deploy/grafana and
  deploy/prometheus.
A self-test breaks the rendered manifests in several ways and requires each to be reported.
"""

import argparse
import copy
import json
import os
import re

import yaml

import deploy_lib as lib

OVERLAYS = ("cpu", "gpu")
GRPC_STATUS_PORT_FIELDS = ("readinessProbe", "livenessProbe", "startupProbe")


def one(docs, kind, errors):
    found = [d for d in docs if d["kind"] == kind]
    errors.check(len(found) == 1, f"expected one {kind}, found {len(found)}")
    return found[0] if found else None


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def port_of(address):
    return int(address.rpartition(":")[2])


def mebibytes(quantity):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G)?", str(quantity))
    if not m:
        return None
    scale = {None: 1 / 2**20, "Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 2**20, "k": 1e3 / 2**20,
             "M": 1e6 / 2**20, "G": 1e9 / 2**20}
    return int(m.group(1)) * scale[m.group(2)]


def cores(quantity):
    q = str(quantity)
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


def check(docs, overlay, ctx, errors):
    """Static checks of one rendered overlay. Returns the server args with values substituted
    (None when they cannot be built)."""
    dep = one(docs, "Deployment", errors)
    if dep is None:
        return None
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"].get("labels", {})
    errors.check(selects(spec["selector"].get("matchLabels"), labels),
                 "the Deployment's selector does not match its pod template's labels")
    containers = [c for c in pod["containers"] if c["name"] == "heavykv"]
    if not errors.check(len(containers) == 1, "no container named heavykv"):
        return None
    c = containers[0]
    cports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}

    # Args and the flags ConfigMap.
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    env = {}
    for ref in c.get("envFrom", []):
        name = ref.get("configMapRef", {}).get("name")
        if errors.check(name in cms, f"envFrom names ConfigMap {name}, which is not rendered"):
            env.update(cms[name].get("data", {}))
    flags_cm = dict(env)
    for e in c.get("env", []):
        env[e["name"]] = e.get("value", "")
    args = c.get("args", [])
    errors.check(not c.get("command"), "set args, not command: the image's ENTRYPOINT is serve")
    try:
        pairs = lib.split_flags(args)
    except ValueError as e:
        errors.add(f"container args: {e}")
        return None
    used = set()
    resolved = []
    for name, value in pairs:
        errors.check(name in ctx["serve_flags"], f"args: --{name} is not a `heavykv serve` flag")
        for var in re.findall(r"\$\((\w+)\)", value or ""):
            used.add(var)
            errors.check(var in env, f"args: --{name} uses $({var}), which nothing defines")
            if var in flags_cm:
                errors.check(var == "HEAVYKV_" + name.upper().replace("-", "_"),
                             f"args: --{name} takes $({var}); name it after the flag")
        value = re.sub(r"\$\((\w+)\)", lambda m: str(env.get(m.group(1), m.group(0))), value or "")
        resolved.append((name, value))
    for key in flags_cm:
        flag = key[len("HEAVYKV_"):].lower().replace("_", "-") if key.startswith("HEAVYKV_") else ""
        errors.check(flag in ctx["serve_flags"],
                     f"ConfigMap key {key} is not HEAVYKV_ + a `heavykv serve` flag")
        errors.check(key in used, f"ConfigMap key {key} is not passed in the container's args")
    flags = dict(resolved)
    arg_list = [f"--{n}={v}" for n, v in resolved]
    ok, why = lib.flags_parse(ctx["binary"], arg_list)
    errors.check(ok, f"`heavykv serve` rejects the rendered args: {why}")

    # Ports, probes, services.
    listen = port_of(flags.get("listen", "0.0.0.0:50051"))
    metrics = port_of(flags.get("metrics-address", "0.0.0.0:9090"))
    errors.check(cports.get("grpc") == listen, f"container port grpc must be --listen's {listen}")
    errors.check(cports.get("metrics") == metrics,
                 f"container port metrics must be --metrics-address's {metrics}")
    # The OpenAI HTTP API (`--http-address`, on by default; "" turns it off).
    http = None if flags.get("http-address") == "" else port_of(flags.get("http-address",
                                                                           "0.0.0.0:8000"))
    if http is not None:
        errors.check(cports.get("http") == http,
                     f"container port http must be --http-address's {http}")
    for probe in GRPC_STATUS_PORT_FIELDS:
        p = c.get(probe)
        if errors.check(p is not None, f"no {probe}"):
            errors.check("grpc" in p and p["grpc"].get("port") == listen,
                         f"{probe} must be a native grpc probe on --listen's port {listen}")
            errors.check(not p.get("grpc", {}).get("service"),
                         f"{probe}: check the server's overall health (service \"\"), which "
                         "turns NOT_SERVING while draining")
    services = [d for d in docs if d["kind"] == "Service"]
    for s in services:
        name = s["metadata"]["name"]
        errors.check(selects(s["spec"].get("selector"), labels),
                     f"Service {name} does not select the heavykv pods")
        for p in s["spec"].get("ports", []):
            t = p.get("targetPort", p["port"])
            errors.check(t in cports or t in cports.values(),
                         f"Service {name} port {p.get('name')} targets {t}, not a container port")
    errors.check(any(s["spec"].get("clusterIP") == "None" for s in services),
                 "no headless Service (clusterIP: None) for client-side load balancing")
    sm = one(docs, "ServiceMonitor", errors)
    if sm:
        picked = [s for s in services
                  if selects(sm["spec"]["selector"].get("matchLabels"), s["metadata"]["labels"])]
        for ep in sm["spec"].get("endpoints", []):
            with_port = [(s, p) for s in picked for p in s["spec"]["ports"]
                         if p.get("name") == ep.get("port")]
            if errors.check(len(with_port) == 1, f"ServiceMonitor port {ep.get('port')} must be "
                            f"on exactly one selected Service (found {len(with_port)}): "
                            "none scrapes nothing, two scrape every pod twice"):
                t = with_port[0][1].get("targetPort")
                errors.check(cports.get(t, t) == metrics,
                             f"ServiceMonitor scrapes {t}, not --metrics-address's {metrics}")
            errors.check(ep.get("path", "/metrics") == "/metrics", "scrape path must be /metrics")

    # Scaling and disruption.
    hpa = one(docs, "HorizontalPodAutoscaler", errors)
    if hpa:
        ref = hpa["spec"]["scaleTargetRef"]
        errors.check((ref.get("kind"), ref.get("name")) == ("Deployment", dep["metadata"]["name"]),
                     "the HPA does not scale the heavykv Deployment")
        errors.check("replicas" not in spec, "leave the Deployment's replicas to the HPA")
        for m in hpa["spec"].get("metrics", []):
            if m["type"] in ("Pods", "Object"):
                name = m[m["type"].lower()]["metric"]["name"]
                errors.check(name in ctx["adapter_metrics"], f"HPA metric {name} is not exposed "
                             "by deploy/prometheus/adapter-rules.yaml")
        min_replicas = hpa["spec"].get("minReplicas", 1)
        pdb = one(docs, "PodDisruptionBudget", errors)
        if pdb:
            errors.check(selects(pdb["spec"]["selector"].get("matchLabels"), labels),
                         "the PodDisruptionBudget does not select the heavykv pods")
            if "maxUnavailable" in pdb["spec"]:
                errors.check(0 < int(pdb["spec"]["maxUnavailable"]) < min_replicas,
                             "PDB maxUnavailable must be in [1, minReplicas) so drains proceed "
                             "and a replica stays")
            else:
                errors.check(int(pdb["spec"]["minAvailable"]) < min_replicas,
                             "PDB minAvailable must be below the HPA's minReplicas")

    # Zero-drop rollouts.
    ru = spec.get("strategy", {}).get("rollingUpdate", {})
    errors.check(str(ru.get("maxUnavailable")) == "0" and int(ru.get("maxSurge", 0)) >= 1,
                 "rollingUpdate must be maxUnavailable 0, maxSurge >= 1")
    pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    sleep = float(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0
    grace = float(flags.get("grace", 30))
    tgps = pod.get("terminationGracePeriodSeconds", 30)
    errors.check(tgps > sleep + grace + 1, f"terminationGracePeriodSeconds {tgps} must exceed "
                 f"preStop {sleep:g} s + --grace {grace:g} s + 1 s of gRPC shutdown")

    # Resources.
    res = c.get("resources", {})
    device = flags.get("device", "cpu")
    errors.check(device in ("cpu", "cuda"), f"--device {device} is neither cpu nor cuda")
    limit = mebibytes(res.get("limits", {}).get("memory", ""))
    pool = float(flags.get("kv-pool-mb", 0))
    if device == "cpu":  # on cuda the pool is GPU memory
        need = pool + ctx["model_mib"] + 256
        errors.check(pool > 0, "on the CPU give --kv-pool-mb (from `heavykv plan`)")
        errors.check(limit is not None and limit >= need,
                     f"memory limit {res.get('limits', {}).get('memory')} must hold --kv-pool-mb "
                     f"{pool:g} + the model + 256 MiB = {need:.0f} MiB")
    threads = int(flags.get("threads", 0))
    cpu = res.get("requests", {}).get("cpu")
    errors.check(threads > 0 and cpu is not None and threads == cores(cpu),
                 f"--threads ({threads}) must equal the CPU request ({cpu}); 0 would start a "
                 "thread per node core")
    gpu_asked = "nvidia.com/gpu" in res.get("limits", {})
    errors.check(gpu_asked == (device == "cuda"), f"--device {device} with"
                 f"{'' if gpu_asked else 'out'} an nvidia.com/gpu limit")
    if overlay == "gpu":
        errors.check(gpu_asked, "the gpu overlay must ask for nvidia.com/gpu")
        errors.check(pod.get("nodeSelector"), "the gpu overlay needs a nodeSelector")
        errors.check(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
                     "the gpu overlay must tolerate the nvidia.com/gpu taint")
    else:
        errors.check(not gpu_asked, f"the {overlay} overlay must not ask for GPUs")
    errors.check(c.get("image", "").endswith(f":{overlay}"),
                 f"image {c.get('image')} must carry the tag {overlay}")

    # Security.
    sc = pod.get("securityContext", {})
    errors.check(sc.get("runAsNonRoot") is True, "set runAsNonRoot: true")
    errors.check(str(sc.get("runAsUser")) == ctx["docker_uid"], f"runAsUser {sc.get('runAsUser')} "
                 f"is not the Dockerfile's USER {ctx['docker_uid']}")

    # Network exposure: gRPC for the cluster's clients, metrics for Prometheus only.
    errors.check(flags.get("reflection", "false").lower() in ("false", "0"),
                 "keep server reflection off (no --reflection): it describes the whole API to "
                 "anyone who can connect, and cannot check API keys")
    np = one(docs, "NetworkPolicy", errors)
    if np:
        nspec = np["spec"]
        errors.check(selects(nspec.get("podSelector", {}).get("matchLabels"), labels),
                     "the NetworkPolicy does not select the heavykv pods")
        errors.check("Ingress" in nspec.get("policyTypes", ["Ingress"]),
                     "the NetworkPolicy must restrict Ingress")
        admitted = {}  # container port number -> the `from` list of each rule admitting it
        for rule in nspec.get("ingress", []):
            for p in rule.get("ports") or [{}]:  # no ports: every port
                ports = list(cports.values()) if "port" not in p else [cports.get(p["port"],
                                                                                  p["port"])]
                for n in ports:
                    admitted.setdefault(n, []).append(rule.get("from") or [])  # none: anyone
        for n in admitted:
            errors.check(n in cports.values(), f"the NetworkPolicy admits port {n}, which is not "
                         "a container port")
        errors.check(listen in admitted, f"the NetworkPolicy does not admit the gRPC port {listen}")
        if http is not None:
            errors.check(http in admitted,
                         f"the NetworkPolicy does not admit the OpenAI HTTP port {http}")
        errors.check(metrics in admitted,
                     f"the NetworkPolicy does not admit the metrics port {metrics}: Prometheus "
                     "could not scrape")
        monitoring = {"namespaceSelector": {"matchLabels":
                                            {"kubernetes.io/metadata.name": "monitoring"}}}
        for peers in admitted.get(metrics, []):
            errors.check(peers and all(peer == monitoring for peer in peers),
                         "the NetworkPolicy admits the metrics port from beyond the monitoring "
                         "namespace (namespaceSelector kubernetes.io/metadata.name: monitoring)")

    # Dashboards and alerts ship as the files CI checks.
    dash = [d for d in docs if d["kind"] == "ConfigMap" and "heavykv-dashboard.json" in
            d.get("data", {})]
    if errors.check(len(dash) == 1, "no ConfigMap with heavykv-dashboard.json"):
        errors.check(json.loads(dash[0]["data"]["heavykv-dashboard.json"]) == ctx["dashboard"],
                     "the dashboard ConfigMap is not deploy/grafana/heavykv-dashboard.json")
        errors.check(dash[0]["metadata"].get("labels", {}).get("grafana_dashboard") == "1",
                     "label the dashboard ConfigMap grafana_dashboard=1 for Grafana's sidecar")
    rule = one(docs, "PrometheusRule", errors)
    if rule:
        errors.check(rule["spec"] == ctx["rules"]["spec"],
                     "the PrometheusRule is not deploy/prometheus/heavykv-rules.yaml")
    return arg_list


def breakages(docs, overlay):
    """(name, broken copy of docs) pairs that check() must report."""
    def dep(d):
        return next(x for x in d if x["kind"] == "Deployment")

    def container(d):
        return dep(d)["spec"]["template"]["spec"]["containers"][0]

    def kind(d, k):
        return next(x for x in d if x["kind"] == k)

    def flags_cm(d):
        return next(x for x in d if x["kind"] == "ConfigMap" and "HEAVYKV_GRACE" in x["data"])

    edits = {
        "readiness probe port": lambda d: container(d)["readinessProbe"]["grpc"].update(port=50052),
        "liveness probe over HTTP": lambda d: container(d).update(
            livenessProbe={"httpGet": {"path": "/", "port": 9090}}),
        "ServiceMonitor port name": lambda d: kind(d, "ServiceMonitor")["spec"]["endpoints"][0]
        .update(port="metric"),
        "Service selector": lambda d: kind(d, "Service")["spec"]["selector"].update(
            {"app.kubernetes.io/name": "heavy"}),
        "Service target port": lambda d: kind(d, "Service")["spec"]["ports"][0].update(
            targetPort=8080),
        "unknown ConfigMap flag": lambda d: flags_cm(d)["data"].update(HEAVYKV_KV_POOL_GB="1"),
        "bad flag value": lambda d: flags_cm(d)["data"].update(HEAVYKV_MAX_RUNNING="many"),
        "undefined $(VAR)": lambda d: container(d)["args"].append("--max-prompt-tokens=$(NOPE)"),
        "short grace period": lambda d: dep(d)["spec"]["template"]["spec"].update(
            terminationGracePeriodSeconds=20),
        "rollout drops a replica": lambda d: dep(d)["spec"]["strategy"]["rollingUpdate"].update(
            maxUnavailable=1),

        "HPA metric": lambda d: kind(d, "HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]
        ["metric"].update(name="heavykv_requests_queued"),
        "threads 0": lambda d: flags_cm(d)["data"].update(HEAVYKV_THREADS="0"),
        "root user": lambda d: dep(d)["spec"]["template"]["spec"]["securityContext"].update(
            runAsUser=0),
        "reflection on": lambda d: container(d)["args"].append("--reflection"),
        "no NetworkPolicy": lambda d: d.remove(kind(d, "NetworkPolicy")),
        "NetworkPolicy selector": lambda d: kind(d, "NetworkPolicy")["spec"]["podSelector"]
        ["matchLabels"].update({"app.kubernetes.io/name": "heavy"}),
        "NetworkPolicy without gRPC": lambda d: kind(d, "NetworkPolicy")["spec"]["ingress"].pop(0),
        "metrics open to all": lambda d: kind(d, "NetworkPolicy")["spec"]["ingress"][1].pop("from"),
        "metrics open to a second namespace": lambda d: kind(d, "NetworkPolicy")["spec"]["ingress"]
        [1]["from"].append({"namespaceSelector": {}}),
        "every port open": lambda d: kind(d, "NetworkPolicy")["spec"]["ingress"][0].pop("ports"),
    }
    if overlay == "gpu":
        edits["no GPU limit"] = lambda d: container(d)["resources"]["limits"].pop("nvidia.com/gpu")
        edits["no GPU toleration"] = lambda d: dep(d)["spec"]["template"]["spec"].pop(
            "tolerations")
    else:
        edits["pool over the memory limit"] = lambda d: flags_cm(d)["data"].update(
            HEAVYKV_KV_POOL_MB="65536")
        edits["GPU limit on the CPU"] = lambda d: container(d)["resources"]["limits"].update(
            {"nvidia.com/gpu": 1})
    for name, edit in edits.items():
        broken = copy.deepcopy(docs)
        edit(broken)
        yield name, broken


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubectl", required=True)
    ap.add_argument("--binary", required=True)
    args = ap.parse_args()
    lib.require_tool(args.kubectl, "kubectl")
    with open(lib.path("deploy/prometheus/adapter-rules.yaml")) as f:
        adapter = yaml.safe_load(f)
    with open(lib.path("deploy/grafana/heavykv-dashboard.json")) as f:
        dashboard = json.load(f)
    with open(lib.path("deploy/prometheus/heavykv-rules.yaml")) as f:
        rules = yaml.safe_load(f)
    with open(lib.path("Dockerfile")) as f:
        users = re.findall(r"^USER\s+(\d+)", f.read(), re.M)
    ctx = {
        "binary": args.binary,
        "serve_flags": lib.serve_flags(args.binary),
        "adapter_metrics": {r["name"]["as"] for r in adapter["rules"]["custom"]},
        "dashboard": dashboard,
        "rules": rules,
        "docker_uid": users[-1] if users else "",
        "model_mib": os.path.getsize(lib.path("models/stories260K.bin")) / 2**20,
    }
    errors = lib.Errors()
    for overlay in OVERLAYS:
        errors.context = f"overlays/{overlay}"
        try:
            docs = lib.render(args.kubectl, overlay)
        except RuntimeError as e:
            errors.add(str(e))
            continue
        server_args = check(docs, overlay, ctx, errors)
        if server_args and not errors.items:
            # The image's model paths -> the repo's models/; a small pool (the real size is
            # checked against the memory limit above); the CPU (CI has no GPU); loopback ports
            # (appended by Server). Later flags win.
            local = [re.sub(r"=/opt/heavykv/models/", "=" + lib.path("models") + "/", a)
                     for a in server_args]
            try:
                with lib.Server(args.binary, local + ["--kv-pool-mb=16", "--device=cpu"],
                                env=lib.IMAGE_ENV):
                    pass
            except RuntimeError as e:
                errors.add(f"the server does not start with the rendered args: {e}")
        errors.context = f"overlays/{overlay} self-test"
        for name, broken in breakages(docs, overlay):
            probe = lib.Errors()
            check(broken, overlay, ctx, probe)
            errors.check(probe.items, f"breaking '{name}' was not reported")
    errors.exit("check_k8s")


if __name__ == "__main__":
    main()

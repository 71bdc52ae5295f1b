#!/usr/bin/env python3
"""Renders every overlay under deploy/k8s/overlays with `kubectl kustomize` and validates each
object against the published schema of its kind (deploy/schemas: Kubernetes' OpenAPI document
for the built-in kinds, the CRDs of the Gateway API, the Inference Extension and the Prometheus
Operator), so a misspelt field fails here rather than being pruned, or refused, by the API
server.

The schemas are made strict as they are loaded: an object schema that lists its `properties`
accepts no others unless it says so (`additionalProperties`, `x-kubernetes-preserve-unknown-
fields`). That is the point: a CRD's openAPIV3Schema lets a validator skip unknown fields, and
the API server drops them silently, so `selecter:` for `selector:` would leave a pool that
selects nothing. `metadata` is checked against Kubernetes' ObjectMeta for every kind. A kind
without a schema is an error. The CRDs' CEL rules and string formats are not evaluated
(deploy/schemas/README.md).

A self-test plants typos and wrong types in the rendered objects (`targetPrt`, `selecter`, a
string port, a missing required field, an unknown kind, ...) and requires each to be reported.
"""

import argparse
import copy
import glob
import json
import os

import jsonschema
import yaml

import deploy_lib as lib

SCHEMAS = lib.path("deploy", "schemas")
K8S_REF = "#/definitions/"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
INT_OR_STRING = {"anyOf": [{"type": "integer"}, {"type": "string"}]}


def strict(node):
    """A copy of an OpenAPI (v2 or v3) schema as a JSON Schema (draft 4) that refuses unknown
    fields: every object with `properties` and neither `additionalProperties` nor
    `x-kubernetes-preserve-unknown-fields` gets `additionalProperties: false`; OpenAPI v3's
    `nullable` becomes a null type; Kubernetes' int-or-string format accepts both."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()
           if k not in ("description", "default", "example")}
    props = node.get("properties")
    if isinstance(props, dict):  # a field may be *named* "properties": only a dict is a schema
        out["properties"] = {k: strict(v) for k, v in props.items()}
        if ("additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
    if node.get("nullable") and "type" in node:
        out["type"] = [node["type"], "null"]
    if node.get("format") == "int-or-string":
        out.pop("type", None)
        out.pop("format", None)
        out.update(INT_OR_STRING)
    return out


def load_schemas():
    """{(apiVersion, kind): JSON schema} for every kind in deploy/schemas."""
    with open(os.path.join(SCHEMAS, "kubernetes", "swagger-subset.json")) as f:
        defs = {name: strict(d) for name, d in json.load(f)["definitions"].items()}
    # A resource quantity is written as a string ("512Mi") or a bare number (`nvidia.com/gpu: 1`);
    # Kubernetes' OpenAPI types it as a string and its decoder takes both.
    defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {
        "anyOf": [{"type": "string"}, {"type": "number"}]}
    schemas = {}
    for name, d in defs.items():
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            if "kind" in d.get("properties", {}):
                api = f"{gvk['group']}/{gvk['version']}" if gvk.get("group") else gvk["version"]
                schemas[(api, gvk["kind"])] = {"definitions": defs, "$ref": K8S_REF + name}
    for crd_file in sorted(glob.glob(os.path.join(SCHEMAS, "*", "*.yaml"))):
        with open(crd_file) as f:
            crd = yaml.safe_load(f)
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        spec = crd["spec"]
        for v in spec["versions"]:
            if not v.get("served", True):
                continue
            s = strict(v["schema"]["openAPIV3Schema"])
            s["properties"]["metadata"] = {"$ref": K8S_REF + OBJECT_META}
            s["definitions"] = defs
            schemas[(f"{spec['group']}/{v['name']}", spec["names"]["kind"])] = s
    return schemas


def where(error):
    parts = []
    for p in error.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else (("." if parts else "") + str(p)))
    return "".join(parts) or "(top level)"


def validate(docs, schemas, errors):
    """Validates every rendered object; one problem per line, with the field's path."""
    for d in docs:
        kind, api = d.get("kind"), d.get("apiVersion")
        name = f"{kind} {d.get('metadata', {}).get('name')}"
        schema = schemas.get((api, kind))
        if not errors.check(schema is not None, f"{name}: no schema for {api} {kind} in "
                            "deploy/schemas (vendor it: deploy/schemas/README.md)"):
            continue
        validator = jsonschema.Draft4Validator(schema)
        for e in sorted(validator.iter_errors(d), key=lambda e: list(map(str, e.path))):
            errors.add(f"{name}: {where(e)}: {e.message}")


def breakages(docs_by_overlay):
    """(name, overlay, broken copy of its objects) that validate() must report."""
    def obj(docs, kind, name=None):
        return next(d for d in docs if d["kind"] == kind
                    and (name is None or d["metadata"]["name"] == name))

    def rename(mapping, old, new):
        mapping[new] = mapping.pop(old)

    def container(docs, name):
        return obj(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]

    edits = [
        ("Service targetPort -> targetPrt", "cpu", lambda d: rename(
            obj(d, "Service", "heavykv")["spec"]["ports"][0], "targetPort", "targetPrt")),
        ("Deployment imagePullPolicy misspelt", "gpu", lambda d: container(d, "heavykv").update(
            imagePulPolicy="Always")),
        ("metadata.labelz", "cpu", lambda d: rename(obj(d, "PodDisruptionBudget")["metadata"],
                                                    "labels", "labelz")),
        ("ConfigMap value not a string", "cpu", lambda d: next(
            x for x in d if x["kind"] == "ConfigMap" and "HEAVYKV_THREADS" in x["data"])["data"]
         .update(HEAVYKV_THREADS=4)),
        ("InferencePool selector -> selecter", "inference-pool", lambda d: rename(
            obj(d, "InferencePool")["spec"], "selector", "selecter")),
        ("InferencePool target port as a name", "inference-pool", lambda d: obj(
            d, "InferencePool")["spec"]["targetPorts"][0].update(number="http")),
        ("InferencePool without its picker's name", "inference-pool", lambda d: obj(
            d, "InferencePool")["spec"]["endpointPickerRef"].pop("name")),
        ("HTTPRoute backendRefs -> backendRef", "inference-pool", lambda d: rename(
            obj(d, "HTTPRoute")["spec"]["rules"][0], "backendRefs", "backendRef")),
        ("Gateway listener without protocol", "inference-pool", lambda d: obj(
            d, "Gateway")["spec"]["listeners"][0].pop("protocol")),
        ("picker containerPort as a string", "inference-pool", lambda d: container(
            d, "heavykv-epp")["ports"][0].update(containerPort="9002")),
        ("ServiceMonitor interval -> intervall", "inference-pool", lambda d: rename(
            obj(d, "ServiceMonitor", "heavykv-epp")["spec"]["endpoints"][0], "interval",
            "intervall")),
        ("NetworkPolicy from -> form", "inference-pool", lambda d: rename(
            obj(d, "NetworkPolicy", "heavykv")["spec"]["ingress"][2], "from", "form")),
        ("Role verbs -> verb", "inference-pool", lambda d: rename(
            obj(d, "Role")["rules"][0], "verbs", "verb")),
        ("PrometheusRule expr -> exp", "cpu", lambda d: rename(
            obj(d, "PrometheusRule")["spec"]["groups"][0]["rules"][0], "expr", "exp")),
        ("HPA minReplicas as text", "cpu", lambda d: obj(d, "HorizontalPodAutoscaler")["spec"]
         .update(minReplicas="two")),
        ("a kind with no schema", "cpu", lambda d: d.append(
            {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})),
    ]
    for name, overlay, edit in edits:
        if overlay in docs_by_overlay:
            broken = copy.deepcopy(docs_by_overlay[overlay])
            try:
                edit(broken)
            except (KeyError, IndexError, StopIteration):  # the field is gone already
                continue
            yield name, overlay, broken


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubectl", required=True)
    args = ap.parse_args()
    lib.require_tool(args.kubectl, "kubectl")
    schemas = load_schemas()
    errors = lib.Errors()
    rendered = {}
    for overlay in lib.overlays():
        errors.context = f"overlays/{overlay}"
        try:
            rendered[overlay] = lib.render(args.kubectl, overlay)
        except RuntimeError as e:
            errors.add(str(e))
            continue
        validate(rendered[overlay], schemas, errors)
        print(f"overlays/{overlay}: {len(rendered[overlay])} objects checked")
    for overlay in ("cpu", "gpu", "inference-pool"):
        errors.context = ""
        errors.check(overlay in rendered, f"overlays/{overlay} was not rendered")
    planted = 0
    for name, overlay, broken in breakages(rendered):
        errors.context = f"overlays/{overlay} self-test"
        before, after = lib.Errors(), lib.Errors()
        validate(rendered[overlay], schemas, before)
        validate(broken, schemas, after)
        planted += 1
        # Only a new problem counts: one the intact overlay already has proves nothing.
        errors.check(set(after.items) - set(before.items), f"planting '{name}' was not reported")
    errors.context = ""
    errors.check(planted == 16, f"only {planted} of the self-test's 16 breakages could be planted: "
                 "update breakages() to the overlays")
    errors.exit("check_schemas")


if __name__ == "__main__":
    main()

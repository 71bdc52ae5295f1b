#!/usr/bin/env python3
"""Cuts Kubernetes' OpenAPI v2 document (swagger.json, 4 MB) down to the kinds deploy/k8s uses.

Usage: prune.py SWAGGER_JSON > swagger-subset.json

It keeps the definitions of the KINDS below and every definition they reach through $ref, and
drops the `description` texts (most of the bytes; the checks never read them). Nothing else is
changed: strictness (no unknown fields) is added by tests/deploy/check_schemas.py when it loads
the file, so this file stays upstream's data. To validate a new kind, add it here and rerun
(deploy/schemas/README.md says where the input comes from).
"""

import json
import sys

# (group, version, kind) of every built-in kind the overlays render, or may render.
KINDS = [
    ("", "v1", "ConfigMap"),
    ("", "v1", "Service"),
    ("", "v1", "ServiceAccount"),
    ("apps", "v1", "Deployment"),
    ("autoscaling", "v2", "HorizontalPodAutoscaler"),
    ("networking.k8s.io", "v1", "NetworkPolicy"),
    ("policy", "v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io", "v1", "Role"),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding"),
]
REF = "#/definitions/"


def refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str) and v.startswith(REF):
                yield v[len(REF):]
            else:
                yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


def strip_descriptions(node):
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items()
                if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    defs = spec["definitions"]
    roots = []
    for gvk in KINDS:
        found = [name for name, d in defs.items()
                 if any((x.get("group", ""), x["version"], x["kind"]) == gvk
                        for x in d.get("x-kubernetes-group-version-kind", []))
                 and "properties" in d and "kind" in d["properties"]]
        if len(found) != 1:
            sys.exit(f"{gvk}: {len(found)} definitions in the input")
        roots.append(found[0])
    keep, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep.add(name)
            todo.extend(refs(defs[name]))
    out = {"swagger": spec.get("swagger"), "info": spec.get("info"),
           "definitions": {n: strip_descriptions(defs[n]) for n in sorted(keep)}}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks the Dockerfile without a Docker engine (CI has none; hadolint is not in Debian).

What it proves:
- the build stage is Debian bookworm and runs the README's scripts: scripts/install-deps.sh,
  then scripts/build.sh (which itself runs install-deps.sh, as scripts/test.sh does), with only
  CMake options that exist;
- the runtime stage is the default target (the last one), on debian:bookworm-slim, installs only
  `install-deps.sh --runtime` (no apt-get of its own anywhere: one package list), and every shared
  library the heavykv binary links is in that list or pulled in by it (readelf + dpkg + apt-cache
  on the binary this build produced, built by the same script on the same Debian);
- it runs as a numeric non-root USER (which Kubernetes' runAsNonRoot can verify);
- ENTRYPOINT is `heavykv serve` from the binary the build stage made, and every flag in CMD is
  one `heavykv serve --help` lists; CMD listens on 0.0.0.0 on the EXPOSEd ports, the model and
  tokenizer it names are the bundled ones where COPY puts them, and `heavykv serve` really starts
  with those flags (and drains and exits 0 on SIGTERM);
- .dockerignore keeps local build directories and .git out of the build context.
A self-test breaks the Dockerfile in several ways and requires each to be reported.
"""

import argparse
import json
import os
import re
import subprocess

import deploy_lib as lib

CMD_MODELS = "models/"


def stage(stages, name):
    for s in stages:
        if s["name"] == name:
            return s
    return None


def runs(st):
    return [a for w, a in st["instructions"] if w == "RUN"] if st else []


def exec_form(errors, st, word):
    values = [a for w, a in st["instructions"] if w == word] if st else []
    if not errors.check(len(values) == 1, f"the runtime stage needs exactly one {word}"):
        return None
    try:
        v = json.loads(values[0])
    except json.JSONDecodeError:
        v = None
    errors.check(isinstance(v, list), f"{word} must be in exec (JSON array) form")
    return v if isinstance(v, list) else None


def cmake_options():
    opts = set()
    for d, _, files in os.walk(lib.ROOT):
        if os.path.basename(d).startswith("build") or "/.git" in d:
            continue
        for f in files:
            if f == "CMakeLists.txt" or f.endswith(".cmake"):
                with open(os.path.join(d, f), errors="replace") as fh:
                    opts |= set(re.findall(r"option\(\s*(HEAVYKV_\w+)", fh.read()))
    return opts


def check_static(text, dockerignore, serve_flags, binary, errors):
    """Everything that needs no process; returns the runtime CMD (or None)."""
    stages = lib.parse_dockerfile(text)
    global_args = [a for w, a in stages[0]["instructions"] if w == "ARG"]
    errors.check("HEAVYKV_CUDA=OFF" in global_args,
                 "declare `ARG HEAVYKV_CUDA=OFF` before the first FROM (the GPU build argument)")
    errors.check(not re.search(r"apt-get\s+install|apt\s+install", text),
                 "install packages only through scripts/install-deps.sh (one package list)")

    build = stage(stages, "build")
    if errors.check(build is not None, "no `FROM ... AS build` stage"):
        errors.check(build["base"] == "debian:bookworm", "the build stage must be debian:bookworm")
        build_runs = " ".join(runs(build))
        calls = re.findall(r"\bbash\s+\S*install-deps\.sh((?:\s+--[a-z]+)*)", build_runs)
        errors.check(any("--runtime" not in c for c in calls),
                     "the build stage must run scripts/install-deps.sh (build packages)")
        errors.check("scripts/build.sh" in build_runs,
                     "the build stage must build with scripts/build.sh, as the README does")
        errors.check("-DHEAVYKV_CUDA=" in build_runs,
                     "the build stage must pass -DHEAVYKV_CUDA from the build argument")
        known = cmake_options()
        for opt in re.findall(r"-D(HEAVYKV_\w+)=", build_runs):
            if opt == "HEAVYKV_CUDA" and opt not in known:
                print("note: CMake has no HEAVYKV_CUDA option yet (the CUDA backend, issue #5)")
                continue
            errors.check(opt in known, f"-D{opt} is not an option() in any CMakeLists.txt")
        m = re.search(r"HEAVYKV_BUILD_DIR=(\S+)", build_runs)
        build_dir = m.group(1) if m else "build"

    runtime = stages[-1]
    errors.check(runtime["name"] == "runtime",
                 "the last stage (docker build's default target) must be `AS runtime`")
    errors.check(runtime["base"] == "debian:bookworm-slim",
                 "the runtime stage must be debian:bookworm-slim")
    rt_runs = " ".join(runs(runtime))
    calls = re.findall(r"\bbash\s+\S*install-deps\.sh((?:\s+--[a-z]+)*)", rt_runs)
    errors.check(calls, "the runtime stage must run `install-deps.sh --runtime`")
    errors.check(all("--runtime" in c for c in calls),
                 "the runtime stage must not install the build packages (use --runtime)")
    users = [a for w, a in runtime["instructions"] if w == "USER"]
    uid = users[-1].split(":")[0] if users else ""
    errors.check(uid.isdigit() and int(uid) != 0,
                 f"the runtime stage must end with a numeric non-root USER (got {uid or 'none'})")
    if uid.isdigit():
        errors.check(re.search(rf"useradd\b[^&;]*--uid\s+{uid}\b", rt_runs),
                     f"USER {uid} is not created with useradd --uid {uid}")

    copies = [a for w, a in runtime["instructions"] if w == "COPY"]
    entry = exec_form(errors, runtime, "ENTRYPOINT")
    if entry is not None:
        errors.check(entry == ["heavykv", "serve"], 'ENTRYPOINT must be ["heavykv", "serve"]')
        if build is not None:
            errors.check(f"--from=build {build_dir}/bin/heavykv /usr/local/bin/heavykv" in copies,
                         f"copy {build_dir}/bin/heavykv from the build stage to /usr/local/bin")
    cmd = exec_form(errors, runtime, "CMD")
    if cmd is None:
        return None
    models_dest = next((a.split()[1] for a in copies if a.split()[0] == CMD_MODELS), None)
    errors.check(models_dest is not None, "the runtime stage must COPY models/ (the bundled model)")
    try:
        flags = dict(lib.split_flags(cmd))
    except ValueError as e:
        errors.add(f"CMD: {e}")
        return None
    for f in flags:
        errors.check(f in serve_flags, f"CMD flag --{f} is not a `heavykv serve` flag")
    ok, why = lib.flags_parse(binary, cmd)
    errors.check(ok, f"`heavykv serve` rejects CMD: {why}")
    exposed = set()
    for w, a in runtime["instructions"]:
        if w == "EXPOSE":
            exposed |= {p.split("/")[0] for p in a.split()}
    ports = set()
    for f in ("listen", "http-address", "metrics-address"):
        host, _, port = (flags.get(f) or "").rpartition(":")
        ports.add(port)
        errors.check(host == "0.0.0.0", f"CMD --{f} must listen on 0.0.0.0 (got {flags.get(f)})")
        errors.check(port in exposed, f"CMD --{f} port {port} is not EXPOSEd ({sorted(exposed)})")
    errors.check(exposed <= ports, f"EXPOSEd ports {sorted(exposed - ports)} serve nothing")
    for f in ("model", "tokenizer"):
        p = flags.get(f) or ""
        if models_dest and errors.check(p.startswith(models_dest),
                                        f"CMD --{f} {p} is not under {models_dest}"):
            rel = os.path.join(CMD_MODELS, p[len(models_dest):].lstrip("/"))
            errors.check(os.path.isfile(lib.path(rel)), f"CMD --{f}: {rel} is not in the repo")

    ignored = {l.strip() for l in dockerignore.splitlines() if l.strip() and l[0] != "#"}
    errors.check(ignored & {"build*", "build*/", "/build*"},
                 ".dockerignore must exclude build*/ (local build trees)")
    errors.check(ignored & {".git", ".git/"}, ".dockerignore must exclude .git")
    return (cmd, models_dest)


def package_of(lib_path):
    for p in (os.path.realpath(lib_path), lib_path,
              os.path.realpath(lib_path).replace("/usr/lib/", "/lib/", 1)):
        r = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0]
    return None


def check_runtime_libraries(binary, errors):
    with open(lib.path("scripts/install-deps.sh")) as f:
        m = re.search(r"^RUNTIME_PKGS=\(([^)]*)\)", f.read(), re.M)
    if not errors.check(m, "scripts/install-deps.sh has no RUNTIME_PKGS=( ... ) list"):
        return
    runtime_pkgs = m.group(1).split()
    for p in runtime_pkgs:
        errors.check(not p.endswith("-dev"), f"RUNTIME_PKGS holds the -dev package {p}")
    closure = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
         "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *runtime_pkgs],
        capture_output=True, text=True)
    if not errors.check(closure.returncode == 0, f"apt-cache depends failed: {closure.stderr}"):
        return
    have = set(re.findall(r"^(?:\s+\S*Depends: )?<?([a-z0-9][a-z0-9.+-]+)", closure.stdout, re.M))
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]",
                        subprocess.run(["readelf", "-d", binary], capture_output=True,
                                       text=True, check=True).stdout)
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", ldd, re.M))
    resolved.update({os.path.basename(p): p for p in re.findall(r"^\s*(/\S+) \(", ldd, re.M)})
    for so in needed:
        pkg = package_of(resolved[so]) if so in resolved else None
        if pkg is None and re.match(r"libcu(da|dart|blas)", so):
            # A CUDA build against NVIDIA's own toolkit (not a Debian package): the GPU image
            # ships Debian's CUDA runtime instead (CUDA_RUNTIME_PKGS), so only check that.
            with open(lib.path("scripts/install-deps.sh")) as f:
                cuda_rt = re.search(r"^CUDA_RUNTIME_PKGS=\(([^)]*)\)", f.read(), re.M)
            stem = re.match(r"lib(\w+?)\.so", so).group(1).lower()
            errors.check(cuda_rt and any(p.startswith("lib" + stem) for p in
                                         cuda_rt.group(1).split()),
                         f"{so}: no lib{stem}* package in CUDA_RUNTIME_PKGS")
            print(f"note: {so} is from {resolved.get(so)}, not a Debian package; the GPU image "
                  "installs CUDA_RUNTIME_PKGS for it")
            continue
        if errors.check(pkg, f"{binary} needs {so}, which no installed package provides"):
            pkg = pkg.split(",")[0].strip()
            errors.check(pkg in have, f"{so} comes from {pkg}, which `install-deps.sh --runtime` "
                                      "does not install: add it to RUNTIME_PKGS")


def self_test(text, dockerignore, serve_flags, binary):
    """Each broken Dockerfile must be reported."""
    breakages = {
        "root user": (text.replace("USER 10001:10001", "USER root"), dockerignore),
        "unknown CMD flag": (text.replace('"--listen"', '"--listen-on"'), dockerignore),
        "port not exposed": (text.replace("EXPOSE 50051 8000 9090", "EXPOSE 50051 9090"), dockerignore),
        "build packages at runtime": (text.replace("--runtime --cuda", "--cuda"), dockerignore),
        "own apt-get": (text.replace("COPY models/", "RUN apt-get install -y curl\nCOPY models/"),
                        dockerignore),
        "no build.sh": (text.replace("scripts/build.sh", "scripts/compile.sh"), dockerignore),
        "entrypoint": (text.replace('["heavykv", "serve"]', '["heavykv"]'), dockerignore),
        "listen on loopback": (text.replace('"0.0.0.0:50051"', '"127.0.0.1:50051"'), dockerignore),
        "build trees in context": (text, dockerignore.replace("build*/", "")),
    }
    failed = []
    for name, (t, d) in breakages.items():
        errors = lib.Errors()
        check_static(t, d, serve_flags, binary, errors)
        if not errors.items:
            failed.append(name)
    return failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    args = ap.parse_args()
    with open(lib.path("Dockerfile")) as f:
        text = f.read()
    dockerignore_path = lib.path(".dockerignore")
    dockerignore = open(dockerignore_path).read() if os.path.exists(dockerignore_path) else ""
    serve_flags = lib.serve_flags(args.binary)
    errors = lib.Errors()
    errors.context = "Dockerfile"
    got = check_static(text, dockerignore, serve_flags, args.binary, errors)
    errors.context = "README scripts"
    with open(lib.path("scripts/build.sh")) as f:
        errors.check("scripts/install-deps.sh" in f.read(),
                     "scripts/build.sh must run install-deps.sh")
    with open(lib.path("scripts/test.sh")) as f:
        errors.check("scripts/build.sh" in f.read(), "scripts/test.sh must run scripts/build.sh")
    errors.context = "runtime libraries"
    check_runtime_libraries(args.binary, errors)
    if got:
        errors.context = "CMD"
        cmd, models_dest = got
        local = [lib.path(CMD_MODELS, a[len(models_dest):].lstrip("/"))
                 if a.startswith(models_dest) else a for a in cmd]
        try:
            with lib.Server(args.binary, local, env=lib.image_env(text)) as server:
                stray = server.threads_taking_sigterm()
                errors.check(not stray, f"threads {stray} would take SIGTERM's default action, so "
                             "a SIGTERM can kill the server instead of draining it")
            errors.check(server.proc.returncode == 0,
                         f"`heavykv serve` with CMD exited {server.proc.returncode} on SIGTERM")
        except RuntimeError as e:
            errors.add(str(e))
    errors.context = "self-test"
    for name in self_test(text, dockerignore, serve_flags, args.binary):
        errors.add(f"a Dockerfile with '{name}' broken was not reported")
    errors.exit("check_dockerfile")


if __name__ == "__main__":
    main()

"""Shared by the deploy checks (tests/deploy/*.py): the repository's paths, the flags that
`heavykv serve` accepts, a `heavykv serve` child process, a small Dockerfile parser, the metric
names in PromQL, and the error list every check appends to.

Each check collects every problem it finds as one line that says what to change, prints them all
and exits 1, so one CI run shows everything that is wrong. Each also runs a self-test that breaks
its input on purpose and requires the check to notice (a check that cannot fail proves nothing).
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def path(*parts):
    return os.path.join(ROOT, *parts)


class Errors:
    """Problems found so far, each with the context it was found in."""

    def __init__(self):
        self.items = []
        self.context = ""

    def add(self, message):
        self.items.append(f"{self.context}: {message}" if self.context else message)

    def check(self, ok, message):
        if not ok:
            self.add(message)
        return ok

    def exit(self, name):
        if self.items:
            print(f"{name}: {len(self.items)} problem(s)", file=sys.stderr)
            for e in self.items:
                print(f"  - {e}", file=sys.stderr)
            sys.exit(1)
        print(f"{name}: OK")


def overlays():
    """The kustomize overlays under deploy/k8s/overlays, by directory name."""
    root = path("deploy", "k8s", "overlays")
    return sorted(d for d in os.listdir(root)
                  if os.path.exists(os.path.join(root, d, "kustomization.yaml")))


def render(kubectl, overlay):
    """The objects `kubectl kustomize deploy/k8s/overlays/OVERLAY` renders; RuntimeError if it
    fails."""
    r = subprocess.run([kubectl, "kustomize", path("deploy", "k8s", "overlays", overlay)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"kubectl kustomize overlays/{overlay} failed:\n{r.stderr}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def require_tool(tool, what):
    """Exits with a clear message when a tool the check needs is missing."""
    if not tool or tool.endswith("NOTFOUND") or not os.access(tool, os.X_OK):
        print(f"{what} not found ({tool!r}): run scripts/install-deps.sh", file=sys.stderr)
        sys.exit(1)


def serve_flags(binary):
    """The flags `heavykv serve --help` lists (without the leading --)."""
    out = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, check=True)
    flags = set(re.findall(r"^\s+--([a-z0-9][a-z0-9-]*)", out.stdout, re.M))
    if "model" not in flags:
        raise RuntimeError(f"cannot read the flags from `heavykv serve --help`:\n{out.stdout}")
    return flags


def split_flags(args):
    """["--a=1", "--b", "2", "--c"] -> [("a", "1"), ("b", "2"), ...]; the values that follow a
    flag without '=' are taken as its value. Raises ValueError on a positional argument."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ValueError(f"positional argument {a!r}")
        if "=" in a:
            name, value = a[2:].split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            name, value = a[2:], args[i + 1]
            i += 1
        else:
            name, value = a[2:], None
        out.append((name, value))
        i += 1
    return out


def flags_parse(binary, args):
    """Whether `heavykv serve ARGS --help` parses: every flag known and of the right type."""
    r = subprocess.run([binary, "serve", *args, "--help"], capture_output=True, text=True)
    return r.returncode == 0, r.stderr.strip().splitlines()[:1]


class Server:
    """`heavykv serve ARGS` with gRPC and metrics on loopback ports it picks itself (appended
    after ARGS, so they win). Use as a context manager; stop() returns the exit status."""

    LISTENING = re.compile(r"gRPC listening on [^:]+:(\d+); metrics on [^:]+:(\d+)")

    def __init__(self, binary, args, env=None, timeout=30):
        cmd = [binary, "serve", *args, "--listen", "127.0.0.1:0",
               "--metrics-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0"]
        self.cmd = " ".join(shlex.quote(c) for c in cmd)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, **(env or {})})
        self.log = []
        self.port = self.metrics_port = None
        ready = threading.Event()

        def reader():
            for line in self.proc.stdout:
                self.log.append(line.rstrip("\n"))
                m = self.LISTENING.search(line)
                if m:
                    self.port, self.metrics_port = int(m.group(1)), int(m.group(2))
                    ready.set()
            ready.set()

        self.thread = threading.Thread(target=reader, daemon=True)
        self.thread.start()
        deadline = time.time() + timeout
        while not ready.wait(0.1) and time.time() < deadline:
            pass
        if self.port is None:
            self.stop()
            raise RuntimeError(f"`{self.cmd}` did not start:\n" + "\n".join(self.log[-20:]))

    def threads_taking_sigterm(self):
        """Threads on which a SIGTERM would take its default action (kill the server instead of
        draining it): those that neither block it nor belong to a process that catches it.
        `heavykv serve` installs a handler, so the answer should be none, whatever threads the
        libraries started."""
        pid, names = self.proc.pid, []
        bit = 1 << (signal.SIGTERM - 1)
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    status = dict(l.split(":", 1) for l in f if ":" in l)
            except FileNotFoundError:  # the thread ended meanwhile
                continue
            caught = int(status["SigCgt"].strip(), 16) & bit
            blocked = int(status["SigBlk"].strip(), 16) & bit
            if not caught and not blocked:
                names.append(status["Name"].strip())
        return names

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.thread.join(timeout=5)
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def parse_dockerfile(text):
    """Stages of a Dockerfile: [{"name", "base", "instructions": [(INSTRUCTION, args)]}], with
    line continuations joined and comments dropped; instructions before the first FROM (global
    ARGs) go to a stage named "" ."""
    lines, cur = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if cur and s.startswith("#"):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        lines.append(cur + s)
        cur = ""
    if cur:
        lines.append(cur)
    stages = [{"name": "", "base": None, "instructions": []}]
    for line in lines:
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
            stages.append({"name": (m.group(2) or "") if m else "", "base": m.group(1) if m else
                           rest, "instructions": []})
        else:
            stages[-1]["instructions"].append((word, rest))
    return stages


def image_env(dockerfile_text):
    """The ENV of the Dockerfile's last (runtime) stage, as a dict: what the container runs with."""
    env = {}
    for word, args in parse_dockerfile(dockerfile_text)[-1]["instructions"]:
        if word == "ENV":
            for item in shlex.split(args):
                if "=" in item:
                    k, v = item.split("=", 1)
                    env[k] = v
    return env


# What `heavykv serve` runs with in the image; the checks that start it use the same.
with open(path("Dockerfile")) as _f:
    IMAGE_ENV = image_env(_f.read())


def heavykv_metric_names(promql):
    """Metric names (heavykv_*) used in a PromQL expression or a label_values() query."""
    return set(re.findall(r"\b(heavykv_[a-zA-Z0-9_:]*[a-zA-Z0-9])", promql))

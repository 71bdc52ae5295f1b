#!/usr/bin/env python3
"""Runs the README's commands as written, and checks that every markdown file's code fences close.

Commands: every ```sh / ```bash block of README.md runs, in order, from the repository root,
with `build/bin/heavykv` replaced by --binary, /tmp/ by a fresh directory, and every port the
README names (127.0.0.1:PORT) by a free loopback port, the same one wherever it recurs, and
`curl` by `curl --fail-with-body` (an HTTP error status fails the command). A line
that starts a server (`build/bin/heavykv serve ...`, with or without a trailing `&`) starts it in
the background; the check waits for its "listening" line, runs the rest, and stops every server
with SIGTERM at the end (the later blocks may use an earlier block's server, as the README says).
A block fails when a command exits non-zero (bash -e, pipefail) or a server does not start.

Skipping is explicit: a block runs unless the line just above its fence is
    <!-- readme-check: skip: REASON -->
with a reason (a download, a GPU, a cluster, a long run, the whole build). The skipped blocks are
printed with their reasons, and a skip without a reason is an error.

Fences: in every tracked *.md file, each ``` or ~~~ fence that opens a code block must be closed
by a fence of the same character, at least as long, before the file ends.

Self-tests: a README whose serve line has an unknown flag must fail, and a file with one fence
removed must be reported.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import deploy_lib as lib

SKIP = re.compile(r"^<!--\s*readme-check:\s*skip\s*:?\s*(.*?)\s*-->\s*$")
SERVE = re.compile(r"^build/bin/heavykv serve\b(.*?)\s*&?\s*$")
PORT = re.compile(r"127\.0\.0\.1:(\d{2,5})\b")


def fence_problems(text):
    """Line numbers (1-based) of code fences that open and never close."""
    opened = None  # (char, length, line)
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})(.*)$", line)
        if not m:
            continue
        run, info = m.group(1), m.group(2)
        if opened is None:
            if run[0] == "`" and "`" in info:
                continue  # an inline code span, not a fence
            opened = (run[0], len(run), n)
        elif run[0] == opened[0] and len(run) >= opened[1] and not info.strip():
            opened = None
    return [opened[2]] if opened else []


def blocks(text):
    """(first line number, language, body, skip reason or None) of each sh/bash block."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if m.group(1) in ("sh", "bash"):
            skip = SKIP.match(lines[i - 1]) if i > 0 else None
            out.append((i + 1, m.group(1), "\n".join(lines[i + 1:j]),
                        None if skip is None else skip.group(1)))
        i = j + 1
    return out


def commands(body):
    """The block's command lines, continuation lines joined."""
    out, cur = [], ""
    for line in body.splitlines():
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip() and not cur.strip().startswith("#"):
            out.append(cur.strip())
        cur = ""
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runner:
    def __init__(self, binary, tmp):
        self.binary, self.tmp = binary, tmp
        self.ports = {}
        self.servers = []

    def rewrite(self, command):
        def port(m):
            p = m.group(1)
            if p not in self.ports:
                self.ports[p] = str(free_port())
            return "127.0.0.1:" + self.ports[p]
        command = PORT.sub(port, command)
        command = command.replace("/tmp/", self.tmp + "/")
        # An HTTP error status fails the command too (curl alone exits 0 on a 400).
        command = re.sub(r"(^|\|\s*)curl ", r"\1curl --fail-with-body ", command)
        return re.sub(r"(?<![\w/])build/bin/heavykv\b", self.binary, command)

    def start_server(self, args):
        log = os.path.join(self.tmp, f"serve{len(self.servers)}.log")
        with open(log, "w") as f:
            command = "exec " + self.rewrite("build/bin/heavykv serve" + args)
            p = subprocess.Popen(["bash", "-c", command], stdout=f, stderr=subprocess.STDOUT,
                                 cwd=lib.ROOT, stdin=subprocess.DEVNULL)
        self.servers.append(p)
        deadline = time.time() + 60
        while time.time() < deadline:
            text = open(log).read()
            if "gRPC listening on" in text:
                return None
            if p.poll() is not None:
                return f"the server exited {p.returncode}: {text.strip()[-400:]}"
            time.sleep(0.1)
        return "the server did not start within 60 s"

    def run_block(self, body):
        """None when every command of `body` succeeds, else what failed."""
        for command in commands(body):
            m = SERVE.match(command)
            if m:
                why = self.start_server(m.group(1))
                if why:
                    return f"`{command}`: {why}"
                continue
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", self.rewrite(command)],
                               cwd=lib.ROOT, capture_output=True, text=True, timeout=300,
                               stdin=subprocess.DEVNULL)
            if r.returncode != 0:
                return (f"`{command}` exited {r.returncode}: "
                        f"{(r.stderr.strip() or r.stdout.strip())[-400:]}")
        return None

    def stop(self):
        for p in self.servers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.servers:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.servers = []


def tracked_markdown():
    r = subprocess.run(["git", "ls-files", "*.md"], cwd=lib.ROOT, capture_output=True, text=True)
    if r.returncode == 0 and r.stdout.strip():
        return r.stdout.split()
    found = []
    for root, dirs, files in os.walk(lib.ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "build"]
        found += [os.path.relpath(os.path.join(root, f), lib.ROOT) for f in files
                  if f.endswith(".md")]
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    args = ap.parse_args()
    errors = lib.Errors()

    for rel in tracked_markdown():
        with open(lib.path(rel)) as f:
            text = f.read()
        for n in fence_problems(text):
            errors.add(f"{rel}:{n}: this code fence is never closed")
    sample = "text\n```sh\necho hi\n```\nmore\n```text\nout\n```\n"
    errors.check(not fence_problems(sample), "self-test: a balanced sample was reported")
    errors.check(fence_problems(sample[:sample.rindex("```")]),
                 "self-test: a fence removed from a sample was not reported")

    with open(lib.path("README.md")) as f:
        readme = blocks(f.read())
    errors.context = "README.md"
    errors.check(readme, "no ```sh or ```bash block")
    tmp = tempfile.mkdtemp(prefix="heavykv-readme-")
    runner = Runner(os.path.abspath(args.binary), tmp)
    ran = skipped = 0
    try:
        for line, _, body, reason in readme:
            if reason is not None:
                skipped += 1
                print(f"skipped the block at line {line}: {reason or '(no reason)'}")
                errors.check(reason, f"line {line}: a readme-check skip needs a reason")
                continue
            ran += 1
            why = runner.run_block(body)
            errors.check(why is None, f"the block at line {line}: {why}")
    finally:
        runner.stop()
    # Self-test: a command that fails is reported, a server that cannot start too.
    errors.context = "self-test"
    try:
        errors.check(runner.run_block("build/bin/heavykv plan --no-such-flag") is not None,
                     "a failing command was not reported")
        errors.check(runner.run_block("build/bin/heavykv serve --port 50051 &") is not None,
                     "a server that cannot start was not reported")
    finally:
        runner.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"README.md: {ran} block(s) run, {skipped} skipped")
    errors.exit("check_readme")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks that every `heavykv plan` example in docs/DEPLOY.md is what the command prints: each
```text block that starts with `$ heavykv plan ...` is run and its output compared line by line.
A self-test requires a changed number in a copy of an example to be reported.
"""

import argparse
import re
import shlex
import subprocess

import deploy_lib as lib


def examples(text):
    """(command line, expected output) for each ```text block that starts with `$ heavykv`."""
    out = []
    for block in re.findall(r"^```text\n(.*?)^```", text, re.M | re.S):
        first, _, rest = block.partition("\n")
        if first.startswith("$ heavykv plan"):
            out.append((first[2:], rest))
    return out


def mismatch(binary, command, expected):
    """None when `command` prints `expected`, else what differs."""
    r = subprocess.run([binary, *shlex.split(command)[1:]], capture_output=True, text=True)
    got = [l.rstrip() for l in r.stdout.rstrip("\n").splitlines()]
    want = [l.rstrip() for l in expected.rstrip("\n").splitlines()]
    if r.returncode != 0:
        return f"exited {r.returncode}: {r.stderr.strip()}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"line {i + 1}: the doc says\n      {w}\n    the command prints\n      {g}"
    if len(got) != len(want):
        return f"the doc shows {len(want)} lines, the command prints {len(got)}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    args = ap.parse_args()
    with open(lib.path("docs/DEPLOY.md")) as f:
        found = examples(f.read())
    errors = lib.Errors()
    errors.context = "docs/DEPLOY.md"
    errors.check(found, "no ```text block starting with `$ heavykv plan`")
    for command, expected in found:
        why = mismatch(args.binary, command, expected)
        errors.check(why is None, f"`{command}`: {why}")
    if found:
        command, expected = found[0]
        broken = re.sub(r"\b(\d+)\b", lambda m: str(int(m.group(1)) + 1), expected, count=4)
        errors.check(mismatch(args.binary, command, broken) is not None,
                     "self-test: a changed example was not reported")
    print(f"{len(found)} `heavykv plan` example(s) checked")
    errors.exit("check_docs")


if __name__ == "__main__":
    main()

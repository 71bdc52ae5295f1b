#!/usr/bin/env python3
"""Differential test of heavykv's chat-template interpreter against jinja2: random templates
built from the constructs chat templates use (for/if/else/set/namespace/comments/{{ }}) with
random whitespace and `-`/`+` markers around every tag, rendered by jinja2 (configured as
render_reference.py does) and by `heavykv chat-template`, which must agree byte for byte, or both
fail.

  random_differential.py HEAVYKV [--seed S] [--count N]

Exit 0 when all agree, 1 on a mismatch (the first few are printed), 77 (ctest: skipped) when
jinja2 cannot be imported.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MESSAGES = [{"role": "system", "content": " sys \n"}, {"role": "user", "content": "Hi\n there"},
            {"role": "assistant", "content": "  ok  "}]
SPACES = ["", " ", "  ", "\n", "\n\n", " \n", "\n  ", "\t", "\n\t ", "\r\n", " \u00a0",
          "\u3000\n"]
EXPRS = ["m.role", "m['content']", "m.content|trim", "loop.index", "'x'", "m.content[1:]",
         "bos_token", "m.role ~ '!'", "loop.first", "ns.n", "(m.content|length) // 2",
         "m.content.split()|join('_')", "m.content|tojson", "loop.revindex0 * 2"]
CONDS = ["loop.first", "m.role == 'user'", "not loop.last", "m.content|trim",
         "add_generation_prompt", "ns.n > 1", "m.missing is defined", "'i' in m.content"]


class Generator:
    def __init__(self, rng):
        self.rng = rng

    def ws(self):
        return self.rng.choice(SPACES)

    def sign(self, variable=False):
        return self.rng.choice(["", "", "-"] if variable else ["", "", "-", "+"])

    def tag(self, inner):
        return "{%" + self.sign() + " " + inner + " " + self.sign() + "%}"

    def body(self, depth):
        parts = []
        for _ in range(self.rng.randint(1, 4)):
            k = self.rng.random()
            if k < 0.3:
                parts.append(self.ws() + self.rng.choice(["a", "TEXT", "x y", "-"]) + self.ws())
            elif k < 0.55:
                parts.append(self.ws() + "{{" + self.sign(True) + " " + self.rng.choice(EXPRS) +
                             " " + self.sign(True) + "}}" + self.ws())
            elif k < 0.7 and depth < 3:
                parts.append(self.ws() + self.tag("if " + self.rng.choice(CONDS)) +
                             self.body(depth + 1) + self.ws() + self.tag("else") +
                             self.body(depth + 1) + self.tag("endif") + self.ws())
            elif k < 0.8:
                parts.append(self.ws() + "{#" + self.sign() + " note " + self.sign() + "#}" +
                             self.ws())
            elif k < 0.9:
                parts.append(self.ws() + self.tag("set ns.n = ns.n + 1") + self.ws())
            else:
                parts.append(self.ws() + self.tag("set t = m.role") + self.ws() + "{{ t }}")
        return "".join(parts)

    def template(self):
        return (self.tag("set ns = namespace(n=0)") + self.ws() + self.tag("for m in messages") +
                self.body(0) + self.ws() + self.tag("endfor") + self.ws() +
                self.rng.choice(["", "\n"]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("heavykv")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=150)
    args = parser.parse_args()
    try:
        import render_reference
        env, _ = render_reference.make_env()
    except ImportError as e:
        print(f"jinja2 is not importable ({e}); skipping", file=sys.stderr)
        return 77
    gen = Generator(random.Random(args.seed))
    mismatches = 0
    with tempfile.TemporaryDirectory() as tmp:
        messages_path = os.path.join(tmp, "messages.json")
        template_path = os.path.join(tmp, "t.jinja")
        with open(messages_path, "w", encoding="utf-8") as f:
            json.dump(MESSAGES, f)
        for _ in range(args.count):
            source = gen.template()
            try:
                want = env.from_string(source).render(
                    messages=MESSAGES, tools=None, documents=None, add_generation_prompt=True,
                    bos_token="<s>", eos_token="")
            except Exception as e:  # both must fail then
                want = None
            with open(template_path, "w", encoding="utf-8", newline="") as f:
                f.write(source)
            run = subprocess.run([args.heavykv, "chat-template", "--template", template_path,
                                  "--messages", messages_path, "--bos", "<s>"],
                                 capture_output=True)
            got = run.stdout.decode("utf-8") if run.returncode == 0 else None
            if got != want:
                mismatches += 1
                if mismatches <= 3:
                    print(f"template {source!r}\n  jinja2:  {want!r}\n  heavykv: {got!r}",
                          file=sys.stderr)
    print(f"{args.count} random templates, {mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

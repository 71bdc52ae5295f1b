#!/usr/bin/env python3
"""Renders every tests/data/chat_templates/*.jinja over a fixed set of conversations with jinja2,
the way Hugging Face transformers compiles chat templates, and writes the results to
tests/data/chat_templates/expected.jsonl (one JSON object per line). tests/chat/chat_template_test.cc
checks heavykv's interpreter (engine/chat/chat_template.h) against that file byte for byte.

  render_reference.py            rewrite expected.jsonl
  render_reference.py --check    exit 1 if expected.jsonl is not what jinja2 renders now,
                                 77 (ctest: skipped) if jinja2 cannot be imported

The environment mirrors transformers' _compile_jinja_template: ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, tojson as json.dumps with
ensure_ascii=False, and the globals raise_exception and strftime_now (here at a fixed date), and
renders with messages, tools=None, documents=None, add_generation_prompt, bos_token, eos_token.
"""
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "chat_templates")
EXPECTED = os.path.join(DATA, "expected.jsonl")

# strftime_now's fixed time (UTC), the same in tests/chat/chat_template_test.cc.
NOW = datetime.datetime(2026, 12, 4, 15, 30, 0)

TOKENS = {
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3.1": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5": ("", "<|im_end|>"),
    "qwen3": ("", "<|im_end|>"),
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "gemma2": ("<bos>", "<eos>"),
    "phi3.5": ("<s>", "<|endoftext|>"),
}
DEFAULT_TOKENS = ("<s>", "</s>")


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    [m("system", "You are a helpful assistant."), m("user", "Hello!")],
    [m("user", "What is 2+2?")],
    [m("system", "Be brief."), m("user", "Hi"), m("assistant", "Hello."), m("user", "Bye")],
    [m("user", "One"), m("assistant", "Two"), m("user", "Three"), m("assistant", "Four")],
    [m("user", "Héllo wörld — 你好 🙂 ünïcödé"), m("assistant", "¡Hola! ✓ Ωmega")],
    [m("user", "  \n\tspaced out \n\n"), m("assistant", "   I am an assistant   "),
     m("user", "\n")],
    [m("user", "first"), m("user", "second, not alternating")],
    [m("system", "Only a system prompt.")],
    [m("user", "Think first."),
     m("assistant", "<think>\nSome reasoning.\n</think>\n\nThe answer is 4."),
     m("user", "And again?")],
    [m("user", "Quotes ' \" and \\ backslash, {{ braces }} {% tag %} <|im_end|> [INST]"),
     m("assistant", "tab\there\r\nwindows line")],
    [],
    [m("assistant", "I speak first."), m("user", "Then me.")],
]


# More variables for some templates (rendered for conversations 0 and 2 besides the plain run),
# as apply_chat_template passes its extra keyword arguments: bools and strings.
EXTRAS = {
    "qwen3": {"enable_thinking": False},
    "llama3.1": {"date_string": "01 Jan 2025"},
}


def make_env():
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env, jinja2


def render_all():
    env, jinja2 = make_env()
    lines = []
    for fname in sorted(os.listdir(DATA)):
        if not fname.endswith(".jinja"):
            continue
        name = fname[: -len(".jinja")]
        with open(os.path.join(DATA, fname), encoding="utf-8", newline="") as f:
            template = env.from_string(f.read())
        bos, eos = TOKENS.get(name, DEFAULT_TOKENS)
        runs = [(index, messages, {}) for index, messages in enumerate(CONVERSATIONS)]
        if name in EXTRAS:
            runs += [(index, CONVERSATIONS[index], EXTRAS[name]) for index in (0, 2)]
        for index, messages, extra in runs:
            for add_generation_prompt in (True, False):
                entry = {"template": name, "conversation": index, "messages": messages,
                         "add_generation_prompt": add_generation_prompt, "bos_token": bos,
                         "eos_token": eos}
                if extra:
                    entry["extra"] = extra
                try:
                    entry["rendered"] = template.render(
                        messages=messages, tools=None, documents=None,
                        add_generation_prompt=add_generation_prompt, bos_token=bos,
                        eos_token=eos, **extra)
                except jinja2.exceptions.UndefinedError as e:
                    entry["error"] = "undefined: " + str(e)
                except jinja2.exceptions.TemplateError as e:
                    entry["raised"] = str(e)
                except Exception as e:  # a Python error inside the template, e.g. TypeError
                    entry["error"] = type(e).__name__ + ": " + str(e)
                lines.append(json.dumps(entry, ensure_ascii=False))
    # One-line templates exercising the expression language (snippets.txt), over a fixed
    # two-message conversation.
    messages = [m("user", "Hi"), m("assistant", "")]
    with open(os.path.join(DATA, "snippets.txt"), encoding="utf-8") as f:
        snippets = [line for line in f.read().split("\n") if line]
    for snippet in snippets:
        entry = {"snippet": snippet, "messages": messages, "add_generation_prompt": True,
                 "bos_token": "", "eos_token": ""}
        try:
            entry["rendered"] = env.from_string(snippet).render(
                messages=messages, tools=None, documents=None, add_generation_prompt=True,
                bos_token="", eos_token="")
        except Exception as e:
            entry["error"] = type(e).__name__ + ": " + str(e)
        lines.append(json.dumps(entry, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def main():
    check = "--check" in sys.argv[1:]
    try:
        text = render_all()
    except ImportError as e:
        print(f"jinja2 is not importable ({e}); skipping", file=sys.stderr)
        return 77 if check else 1
    if check:
        with open(EXPECTED, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{EXPECTED} is stale: rerun {sys.argv[0]}", file=sys.stderr)
                return 1
        return 0
    with open(EXPECTED, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {text.count(chr(10))} renderings to {EXPECTED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

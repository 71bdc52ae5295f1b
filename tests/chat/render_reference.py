#!/usr/bin/env python3
"""Renders every tests/data/chat_templates/*.jinja over a fixed set of conversations with jinja2,
the way Hugging Face transformers compiles chat templates, and writes the results to
tests/data/chat_templates/expected.jsonl (one JSON object per line). tests/chat/chat_template_test.cc
checks heavykv's interpreter (engine/chat/chat_template.h) against that file byte for byte.

  render_reference.py            rewrite expected.jsonl and tools_expected.jsonl
  render_reference.py --check    exit 1 if they are not what jinja2 renders now,
                                 77 (ctest: skipped) if jinja2 cannot be imported

tools_expected.jsonl holds the tool-calling conversations (TOOL_CONVERSATIONS) rendered with
`tools` and chat_template_kwargs of any JSON type, the messages prepared as vLLM prepares an
OpenAI request's: each tool call's `arguments` (JSON text in the API) parsed into a dict.

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
TOOLS_EXPECTED = os.path.join(DATA, "tools_expected.jsonl")

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


# OpenAI-shaped tools and tool-calling conversations (function.arguments is JSON text here, as
# clients send it).
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time now, in a time zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}},
]


def call(id, name, arguments):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


TOOL_CONVERSATIONS = [
    [m("system", "You are a helpful assistant."), m("user", "Weather in Paris?")],
    [m("user", "Weather in Paris?"),
     {"role": "assistant", "content": None,
      "tool_calls": [call("Wx7Kp2Qa1", "get_weather", '{"city": "Paris", "unit": "celsius"}')]},
     {"role": "tool", "tool_call_id": "Wx7Kp2Qa1", "name": "get_weather",
      "content": '{"temperature": 21.5, "sky": "clear"}'}],
    [m("system", "Be brief."), m("user", "Weather in Oslo, and the time there?"),
     {"role": "assistant", "content": "Checking both.",
      "tool_calls": [call("Ab3dE5fG7", "get_weather", '{"city": "Oslo"}'),
                     call("Hj9kL1mN3", "get_time", '{"tz": "Europe/Oslo"}')]},
     {"role": "tool", "tool_call_id": "Ab3dE5fG7", "content": "-3 C, snow"},
     {"role": "tool", "tool_call_id": "Hj9kL1mN3", "content": "14:05"},
     m("assistant", "It is -3 C and snowing; the time is 14:05."), m("user", "Thanks!")],
    [m("user", "What time is it?"),
     {"role": "assistant", "content": "", "reasoning_content": "The user wants the time.",
      "tool_calls": [call("Pq5rS7tU9", "get_time", "")]},
     {"role": "tool", "tool_call_id": "Pq5rS7tU9", "content": "09:00"}],
]

# chat_template_kwargs per template, JSON of any type (rendered for every tool conversation).
TOOL_EXTRAS = {
    "qwen3": [{"enable_thinking": False}],
    "llama3.1": [{"date_string": "26 Jul 2024", "tools_in_user_message": False},
                 {"custom_tools": [TOOLS[1]], "builtin_tools": ["brave_search"]}],
    "llama3.2": [{"date_string": "26 Jul 2024", "tools_in_user_message": False}],
}


def vllm_messages(messages):
    """The messages as vLLM hands them to the template: tool-call arguments parsed."""
    out = json.loads(json.dumps(messages))
    for message in out:
        for item in message.get("tool_calls") or []:
            arguments = item["function"].get("arguments")
            item["function"]["arguments"] = json.loads(arguments) if arguments else {}
    return out


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


def render_tools():
    env, jinja2 = make_env()
    lines = []
    for fname in sorted(os.listdir(DATA)):
        if not fname.endswith(".jinja"):
            continue
        name = fname[: -len(".jinja")]
        with open(os.path.join(DATA, fname), encoding="utf-8", newline="") as f:
            template = env.from_string(f.read())
        bos, eos = TOKENS.get(name, DEFAULT_TOKENS)
        for index, messages in enumerate(TOOL_CONVERSATIONS):
            for extra in [{}] + TOOL_EXTRAS.get(name, []):
                for add_generation_prompt in (True, False):
                    entry = {"template": name, "conversation": index, "messages": messages,
                             "tools": TOOLS, "add_generation_prompt": add_generation_prompt,
                             "bos_token": bos, "eos_token": eos}
                    if extra:
                        entry["extra"] = extra
                    try:
                        entry["rendered"] = template.render(
                            messages=vllm_messages(messages), tools=TOOLS, documents=None,
                            add_generation_prompt=add_generation_prompt, bos_token=bos,
                            eos_token=eos, **extra)
                    except jinja2.exceptions.UndefinedError as e:
                        entry["error"] = "undefined: " + str(e)
                    except jinja2.exceptions.TemplateError as e:
                        entry["raised"] = str(e)
                    except Exception as e:
                        entry["error"] = type(e).__name__ + ": " + str(e)
                    lines.append(json.dumps(entry, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def main():
    check = "--check" in sys.argv[1:]
    try:
        files = [(EXPECTED, render_all()), (TOOLS_EXPECTED, render_tools())]
    except ImportError as e:
        print(f"jinja2 is not importable ({e}); skipping", file=sys.stderr)
        return 77 if check else 1
    for path, text in files:
        if check:
            with open(path, encoding="utf-8") as f:
                if f.read() != text:
                    print(f"{path} is stale: rerun {sys.argv[0]}", file=sys.stderr)
                    return 1
            continue
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {text.count(chr(10))} renderings to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

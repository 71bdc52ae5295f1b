#!/usr/bin/env bash
# Regenerates the committed seed corpora in tests/fuzz/corpus/<target>/: a few valid and a few
# broken inputs per fuzz target, each a few KB at most. Run from anywhere after a build; the
# output is deterministic, so a rerun shows no diff unless a format changed.
# Usage: tests/fuzz/make_seed_corpus.sh [path/to/heavykv]  (default build-asan/bin/heavykv)
set -euo pipefail
cd "$(dirname "$0")/../.."
HEAVYKV="${1:-build-asan/bin/heavykv}"
OUT=tests/fuzz/corpus
rm -rf "$OUT"
for t in model_loader tokenizer bpe_tokenizer request_validation proto_convert gguf chat_template \
  http_request grammar_compile chat_output; do
  mkdir -p "$OUT/${t}_fuzzer"
done
# gguf_fuzzer: written from the GGUF specification by its own script.
python3 tests/fuzz/make_gguf_seed_corpus.py "$OUT/gguf_fuzzer"

# model_loader_fuzzer: the checkpoint file itself. Valid: tiny random models from make-model
# (shared and separate classifier, grouped-query attention). Broken: truncated, header only,
# trailing data, vocab_size INT32_MIN (issue 13's UBSan finding), zero layers, odd head size,
# a parameter count that overflows int64.
m="$OUT/model_loader_fuzzer"
"$HEAVYKV" make-model --dim 8 --hidden-dim 16 --layers 1 --heads 2 --vocab 4 --seq-len 4 \
  --out "$m/valid_shared" 2>/dev/null
"$HEAVYKV" make-model --dim 8 --hidden-dim 8 --layers 2 --heads 2 --kv-heads 1 --vocab 5 \
  --seq-len 3 --separate-classifier --seed 2 --out "$m/valid_gqa_separate" 2>/dev/null
python3 - "$m" <<'PY'
import struct, sys
d = sys.argv[1]
raw = open(f"{d}/valid_shared", "rb").read()
def put(name, data): open(f"{d}/{name}", "wb").write(data)
def header(fields): return struct.pack("<7i", *fields) + raw[28:]
put("broken_truncated", raw[:-4])
put("broken_header_only", raw[:28])
put("broken_trailing", raw + b"\0" * 4)
put("broken_vocab_int32_min", header([8, 16, 1, 2, 2, -2**31, 4]))
put("broken_zero_layers", header([8, 16, 0, 2, 2, 4, 4]))
put("broken_odd_head_size", header([6, 16, 1, 2, 2, 4, 4]))
# Every field within its own bounds, the parameter count past int64 (found by UBSan).
put("broken_params_overflow_int64", struct.pack("<7i", 2**30, 1, 4, 2**20, 2**20, 1, 1) + bytes(64))
PY

# tokenizer_fuzzer: uint16 vocab_size - 259, uint16 text length, text, tokenizer file.
python3 - "$OUT/tokenizer_fuzzer" <<'PY'
import struct, sys
d = sys.argv[1]
def tok_file(pieces, max_len=8, bad_len=None):
    out = struct.pack("<i", max_len)
    for i, (p, score) in enumerate(pieces):
        n = len(p) if bad_len is None or i != 5 else bad_len
        out += struct.pack("<fi", score, n) + p
    return out
base = [(b"<unk>", 0.0), (b"<s>", 0.0), (b"</s>", 0.0)]
base += [(b"<0x%02X>" % i, 0.0) for i in range(256)]
merges = [(b" ", -1.0), (b"a", -2.0), (b"b", -3.0), (b"ab", -4.0), (b" a", -5.0),
          (b" ab", -6.0), (b"\xc3\xa9", -7.0), (b"ba", -8.0)]
pieces = base + merges
good = tok_file(pieces)
def put(name, text, file, vocab=len(pieces)):
    open(f"{d}/{name}", "wb").write(struct.pack("<HH", vocab - 259, len(text)) + text + file)
put("valid_ab", b"ab ab ba b", good)
put("valid_utf8", "caf\u00e9 \u00e9t\u00e9 \u2603".encode(), good)
put("valid_bytes", b"\x00\xff\xfe a\x80b\xc3", good)
put("valid_empty_text", b"", good)
# Special-token texts: the SentencePiece pass types some pieces control / user-defined from the
# input's bytes.
specials = pieces + [(b"<|end|>", 0.0), (b"<|user|>", 0.0), (b"\n", -9.0)]
put("valid_specials", b"<s>  <|user|>\n ab<|end|>\n</s>ba <unk>", tok_file(specials), len(specials))
put("broken_vocab_mismatch", b"ab", good, vocab=len(pieces) + 1)
put("broken_truncated", b"ab", good[:-3])
put("broken_negative_length", b"ab", tok_file(pieces, bad_len=-1))
put("broken_max_token_length", b"ab", tok_file(pieces, max_len=0))
PY

# bpe_tokenizer_fuzzer: byte 0 < 0x80 picks a pre-tokenizer and the rest is text; byte 0 >= 0x80
# reads the rest as a vocabulary (tokens, an empty line, merges).
python3 - "$OUT/bpe_tokenizer_fuzzer" <<'PY'
import sys
d = sys.argv[1]
def put(name, data): open(f"{d}/{name}", "wb").write(data)
put("text_english", b"\x00" + b"the cat's 12 resumes\n\nin the  morning <|end|> an <think>")
put("text_unicode", b"\x05" + "r\u00e9sum\u00e9 \u4e2d\u6587 \U0001F600 \u0627\u0644\u0639".encode())
put("text_invalid_utf8", b"\x09" + b"\xff\xfe a\x80\xc3 \xed\xa0\x80 \xf4\x90\x80\x80")
put("text_specials", b"\x11" + b"<|end|><|x|><|end|<|x|>x<think><think")
put("text_whitespace", b"\x17" + b"  \t\n\r\n   \n\n 123456789 x")
put("vocab_valid", b"\x80" + b"a\nb\nab\nc\n\na b\n")
put("vocab_unknown_merge", b"\x81" + b"a\nb\n\na b\n")
put("vocab_bad_merge", b"\x82" + b"a\nb\nab\n\nab\n")
PY

# request_validation_fuzzer: FuzzedDataProvider bytes (any bytes are a request); a few fixed
# pseudo-random inputs of different lengths.
python3 - "$OUT/request_validation_fuzzer" <<'PY'
import random, sys
d = sys.argv[1]
for n in (16, 64, 256, 1024):
    r = random.Random(n)
    open(f"{d}/random_{n}", "wb").write(bytes(r.randrange(256) for _ in range(n)))
open(f"{d}/text_prompt", "wb").write(b"\x01Once upon a time" + b"\x00" * 32 + b"\x01\x10")
PY

# proto_convert_fuzzer: serialized heavykv.v1.GenerateRequest messages, written from text format.
p="$OUT/proto_convert_fuzzer"
encode() {  # encode NAME TEXT
  printf '%s\n' "$2" | protoc -I proto --encode=heavykv.v1.GenerateRequest \
    proto/heavykv/v1/generation.proto >"$p/$1"
}
encode valid_text 'request_id: "r1" prompt: "Once upon a time" max_new_tokens: 8'
encode valid_ids \
  'prompt_token_ids { ids: [1, 403, 407] } max_new_tokens: 4 stop: "." stop_token_ids: 2'
encode valid_sampling \
  'prompt: "Hi" sampling { temperature: 0.7 top_p: 0.9 top_k: 20 seed: 7 } logprobs: true'
encode valid_kv 'prompt: "Lily" kv { policy: "h2o" budget_fraction: 0.25 recent_fraction: 0.5 }'
encode broken_no_prompt 'max_new_tokens: 4'
encode broken_bad_ids 'prompt_token_ids { ids: [-1, 512, 2147483647] }'
encode broken_bad_utf8 'prompt: "\377\376" stop: ""'
encode broken_too_long 'prompt: "a" max_new_tokens: 100000 kv { budget_tokens: -3 }'
printf '\x12\xff\xff\xff\xff\x0f' >"$p/broken_wire_format"
ls -l "$OUT"/*

# chat_template_fuzzer: flags byte | template | NUL | message content. Every template of
# tests/data/chat_templates/ (add_generation_prompt on; a system message on every other one),
# plus seeds of the expression language, whitespace control, macros and a namespace cycle.
python3 - "$OUT/chat_template_fuzzer" tests/data/chat_templates <<'PY'
import os, sys
out, src = sys.argv[1], sys.argv[2]
names = sorted(f for f in os.listdir(src) if f.endswith(".jinja"))
for i, f in enumerate(names):
    body = open(os.path.join(src, f), "rb").read()
    flags = bytes([1 + (i % 2) * 2])
    open(os.path.join(out, f[:-6]), "wb").write(flags + body + b"\0" + "Héllo {{ x }} \n\t".encode())
extra = {
    "expressions": b"\x01{{ [1,2,3][::-1] }}{{ {'a':1}|tojson(indent=2) }}{% set ns = namespace(x=0) %}"
    b"{% for i in range(3) if i is odd %}{% set ns.x = ns.x + i %}{{ loop.index }}{% else %}e"
    b"{% endfor %}{{ ns.x ~ 'z' * 3 }}{{ messages|selectattr('role','equalto','user')"
    b"|map(attribute='content')|join(',') }}",
    "macros": b"\x01{% macro m(a, b=2) %}{{ a ~ b }}{{ m(a) if a|length < 3 }}{% endmacro %}"
    b'{{ m("x") }}{{ m(b=1, a="y") }}',
    # A namespace holding itself (found by the fuzzer as a leak; the render breaks the cycle).
    "namespace_cycle": b"\x01{% set ns = namespace(x=0) %}{% set ns.x = ns %}{{ ns }}{{ ns.x.x.x }}",
    "whitespace": b"\x00a\n  {%- if true +%}\n  b {# c -#}\n{%+ endif -%}  {{- ' x ' | trim -}}\n",
}
for name, data in extra.items():
    open(os.path.join(out, name), "wb").write(data)
PY

# http_request_fuzzer: two cut bytes (where the client's writes are split), then the bytes sent:
# keep-alive and pipelined requests, a chunked and a 100-continue body, a stream, HEAD, HTTP/1.0,
# and broken ones (a bad Content-Length, both length headers, a bad chunk size, half a head).
python3 - "$OUT/http_request_fuzzer" <<'PY'
import os, sys
out = sys.argv[1]
seeds = {
    "get": b"GET /hello?x HTTP/1.1\r\nHost: a\r\n\r\n",
    "pipelined": b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\nPOST /echo HTTP/1.1\r\nHost: a\r\n"
                 b"Content-Length: 3\r\nX-Header: h\r\n\r\nabcHEAD /hello HTTP/1.1\r\n\r\n",
    "chunked": b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3\r\nabc\r\n0\r\n\r\n",
    "continue": b"POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n"
                b"Content-Length: 2\r\n\r\nhi",
    "stream": b"POST /stream HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"
              b"GET /hello HTTP/1.1\r\n\r\n",
    "http10": b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /hello HTTP/1.0\r\n\r\n",
    "bad_length": b"POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    "both_lengths": b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"3\r\nabc\r\n0\r\n\r\n",
    "bad_chunk": b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
    "half_head": b"GET /hello HTTP/1.1\r\nHo",
    "wrong_method": b"DELETE /hello HTTP/1.1\r\n\r\nGET /nowhere HTTP/1.1\r\n\r\n",
}
for i, (name, data) in enumerate(sorted(seeds.items())):
    open(os.path.join(out, name), "wb").write(bytes([i * 7 % 256, i * 13 % 256]) + data)
PY

# grammar_compile_fuzzer: flags byte (bit 0 GBNF, bit 1 regex search) | source | NUL | a text.
# llama.cpp's example grammars (tests/data/gbnf) with a text each, real-world JSON Schema
# patterns, and broken ones (refused constructs, left recursion, counts past the limits).
python3 - "$OUT/grammar_compile_fuzzer" tests/data/gbnf <<'PY'
import os, sys
out, src = sys.argv[1], sys.argv[2]
texts = {"json": '{"a": [1, -2.5e3, "x\\u00e9"], "b": null}', "arithmetic": "x *(y -2)=z\n",
         "list": "- one\n- two\n", "chess": "1. e4 e5\n2. Nf3 Nc6\n", "c": "int f(){return 0;}"}
for f in sorted(os.listdir(src)):
    if f.endswith(".gbnf"):
        body = open(os.path.join(src, f), "rb").read()
        text = texts.get(f[:-5], "abc").encode()
        open(os.path.join(out, "gbnf_" + f[:-5]), "wb").write(b"\x01" + body + b"\0" + text)
seeds = {
    "regex_date": (2, rb"^\d{4}-\d{2}-\d{2}$", b"2024-02-29"),
    "regex_email": (2, rb"^[^@\s]+@[^@\s]+\.[^@\s]+$", b"a@b.co"),
    "regex_anchor_branches": (2, rb"(^|,)x(,|$)|^a|b$", b"a,x,b"),
    "regex_classes": (0, rb"[\w-.]+[^\]\\]\s\S\d\D\u{1F600}\uD83D\uDE00.[\b]", b"a-.x \x00"),
    "regex_quantifiers": (0, rb"(?:a?b?){2,5}?((c|d)*e+){0,3}f{3}(?<n>g)", b"abcefffg"),
    "regex_refused": (0, rb"(a)\1(?=b)\b\p{L}(?i)", b""),
    "regex_limits": (2, rb"((a{200}){200}){200}", b"aaaa"),
    "gbnf_left_recursion": (1, b"root ::= root \"a\" | \"b\"", b"ba"),
    "gbnf_nullable_star": (1, b"root ::= (\"a\"? ws)* [^\\x00-\\x1f]{2,3}\nws ::= [ \\t]*",
                           b"a a  xy"),
    "gbnf_broken": (1, b"root ::= (\"a\" | [z-a]\n  | x{3,1} <[12]>", b""),
}
for name, (flags, source, text) in seeds.items():
    open(os.path.join(out, name), "wb").write(bytes([flags]) + source + b"\0" + text)
PY

# chat_output_fuzzer: flags byte (bits 0-1 the tool-call format: 0 Qwen, 1 Llama 3, 2 generic;
# bit 2 the prompt opened a reasoning block) | split seed byte | a model's text: calls of each
# format, reasoning blocks, and calls cut short or broken.
python3 - "$OUT/chat_output_fuzzer" <<'PY'
import os, sys
out = sys.argv[1]
seeds = {
    "qwen_calls": (0, b'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
                      b'"Paris", "days": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": "f", '
                      b'"arguments": {}}\n</tool_call>'),
    "qwen_broken": (0, b'<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call> <tool_ca'
                       b'll>{"name": "get_time", "arguments": {"s": "\\"}\\\\"'),
    "llama3_calls": (1, b'<|python_tag|>{"type": "function", "name": "get_time", "parameters": '
                        b'{"tz": "UTC"}}; {"name": "f", "parameters": {}}'),
    "generic_list": (2, b'[{"name": "f", "arguments": {"a": [{"b": null}]}}, {"name": '
                        b'"get_weather", "arguments": {}}] trailing'),
    "reasoning": (4, b'hmm <tool_call> 2+2\n</think>\n\n<tool_call>\n{"name": "f", '
                     b'"arguments": {}}\n</tool_call>'),
    "think_tags": (0, b' <think>\nA </thi nk> B\n</think>\n\nAnswer <think> again'),
}
for i, (name, (flags, text)) in enumerate(sorted(seeds.items())):
    open(os.path.join(out, name), "wb").write(bytes([flags, i * 37 % 256]) + text)
PY

#!/usr/bin/env bash
# ctest's grammar_test_suite_cli: `heavykv grammar test` over the JSON-Schema-Test-Suite files in
# tests/data/json_schema_test_suite, token by token through the masks of a real vocabulary
# (Llama 3's from ../shared/gguf when present, else the bundled model's SentencePiece one). It
# fails (exit 2) when an invalid instance is accepted; schemas that do not compile are allowed
# (they are refused with an error, never half-enforced). Prints the summary line.
set -euo pipefail
bin="$1"
src="$2"
vocab="$src/../shared/gguf/llama3-vocab.gguf"
if [ -f "$vocab" ]; then
  model=(--model "$vocab")
else
  model=(--model "$src/models/stories260K.bin" --tokenizer "$src/models/tok512.bin")
fi
"$bin" grammar test "${model[@]}" "$src"/tests/data/json_schema_test_suite/*/*.json | tail -1

#!/usr/bin/env bash
# Writes tests/data/gguf/special.jsonl: what llama.cpp's llama-tokenize (commit c392e50) gives for
# chat-style texts with special tokens, with and without BOS and special-token parsing. One JSON
# object per line: {"vocab", "text", "bos", "parse_special", "ids"}; tests/text_tokenizer_test.cc
# reads it (it never runs llama.cpp).
#
#   tests/data/gguf/make_special_vectors.sh [path/to/llama-tokenize]
#
# Run from the repository root; llama3-vocab.gguf and qwen-vocab.gguf come from ../shared/gguf/.
set -euo pipefail
tokenize=${1:-/work/llamacpp/build/bin/llama-tokenize}
out=tests/data/gguf/special.jsonl

vocab_path() {
  if [[ -f tests/data/gguf/$1 ]]; then echo "tests/data/gguf/$1"; else echo "../shared/gguf/$1"; fi
}

# vocab TAB text (bash $'' escapes); each text is tokenized four ways.
cases=(
  "llama3-vocab.gguf"$'\t'$'<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi \u2603<|eot_id|>'
  "llama3-vocab.gguf"$'\t'$'<|start_header_id|>assistant<|end_header_id|>\n\n <|eot_id|> x<|eot_id|><|eot_id|>'
  "qwen-vocab.gguf"$'\t'$'<|im_start|>user\nhello<|im_end|>\n'
  "qwen-vocab.gguf"$'\t'$'<|im_start|>system\n \u00e9t\u00e9<|im_end|><|endoftext|> <|im_start|>'
  "qwen-vocab.gguf"$'\t'$'<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|><|file_sep|>a<|repo_name|> b<|fim_pad|>'
  "ggml-vocab-deepseek-coder.gguf"$'\t'$'<\uff5cfim\u2581begin\uff5c>def f():<\uff5cfim\u2581hole\uff5c>\n<\uff5cfim\u2581end\uff5c>'
  "ggml-vocab-phi-3.gguf"$'\t'$'<|user|>\nHi<|end|>\n<|assistant|>'
  "ggml-vocab-phi-3.gguf"$'\t'$'<|system|> \t\n You are here.<|end|>\n\n<|user|>\n\nHi <|end|> x</s>  y<s> z<|endoftext|> w'
  "ggml-vocab-llama-spm.gguf"$'\t'$'<s>[INST] hi [/INST]'
  "ggml-vocab-llama-spm.gguf"$'\t'$'[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nhi [/INST] Hello</s><s> [INST]x<unk>y'
)

: >"$out"
for c in "${cases[@]}"; do
  vocab=${c%%$'\t'*}
  text=${c#*$'\t'}
  for bos in true false; do
    for special in true false; do
      flags=(--ids --log-disable --no-escape)
      [[ $bos == false ]] && flags+=(--no-bos)
      [[ $special == false ]] && flags+=(--no-parse-special)
      ids=$("$tokenize" -m "$(vocab_path "$vocab")" -p "$text" "${flags[@]}" 2>/dev/null | tail -n 1)
      python3 -c 'import json, sys
print(json.dumps({"vocab": sys.argv[1], "text": sys.argv[2], "bos": sys.argv[3] == "true",
                  "parse_special": sys.argv[4] == "true", "ids": json.loads(sys.argv[5])},
                 ensure_ascii=False))' "$vocab" "$text" "$bos" "$special" "$ids" >>"$out"
    done
  done
done
echo "wrote $(wc -l <"$out") vectors to $out"

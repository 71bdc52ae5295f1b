#!/usr/bin/env bash
# Builds heavykv and runs it on the bundled model. Extra arguments go to `heavykv run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec "${HEAVYKV_BUILD_DIR:-build}/bin/heavykv" run --model models/stories260K.bin \
  --tokenizer models/tok512.bin --prompt "Once upon a time" "$@"

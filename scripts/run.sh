#!/usr/bin/env bash
# Builds heavykv and serves the bundled model over gRPC (`heavykv serve`). Extra arguments go to
# `heavykv serve`, e.g. --listen 127.0.0.1:50051 --policy h2o --kv-budget 0.25.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec "${HEAVYKV_BUILD_DIR:-build}/bin/heavykv" serve --model models/stories260K.bin \
  --tokenizer models/tok512.bin "$@"

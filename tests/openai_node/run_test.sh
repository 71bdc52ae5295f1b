#!/usr/bin/env bash
# ctest's openai_node_client: installs the pinned `openai` package into this folder (npm ci from
# package-lock.json; nothing global, node_modules is not committed) when it is missing or older
# than the lockfile, then runs client_test.mjs with node's test runner. Exit 77 (skipped) where
# node or npm is not installed.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "node or npm is not installed: skipped"
  exit 77
fi
if [ ! -f node_modules/openai/package.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
exec node --test client_test.mjs

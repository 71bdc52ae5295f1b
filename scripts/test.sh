#!/usr/bin/env bash
# Builds heavykv and runs every test (ctest). This is what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd "${HEAVYKV_BUILD_DIR:-build}"
ctest -j2 --output-on-failure --timeout 600

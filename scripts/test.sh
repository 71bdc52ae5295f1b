#!/usr/bin/env bash
# Builds heavykv and runs every test (ctest), then the sanitizer build, its tests and the fuzz
# targets (scripts/test-sanitizers.sh; HEAVYKV_SKIP_SANITIZERS=1 skips them). This is what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
(cd "${HEAVYKV_BUILD_DIR:-build}" && ctest -j2 --output-on-failure --timeout 600)
bash scripts/test-sanitizers.sh

#!/usr/bin/env bash
# Installs missing Debian packages, configures and builds heavykv into build/ (Release, -j2).
# Usage: scripts/build.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR="${HEAVYKV_BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "${HEAVYKV_JOBS:-2}"

#!/usr/bin/env bash
# Installs every Debian package heavykv needs to build, test and run, and nothing else.
# The single source of truth for dependencies: the README, .ci/run and the Dockerfile call it.
# Usage: scripts/install-deps.sh [--runtime]   (--runtime: only the shared libraries needed to run)
set -euo pipefail

BUILD_PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev prometheus-cpp-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-grpcio python3-protobuf
)
RUNTIME_PKGS=(
  libgrpc++1.51 libprotobuf32 libabsl20220623 libspdlog1.10 libfmt9
  libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libopenblas0-pthread libgomp1
)

if [[ "${1:-}" == "--runtime" ]]; then PKGS=("${RUNTIME_PKGS[@]}"); else PKGS=("${BUILD_PKGS[@]}"); fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

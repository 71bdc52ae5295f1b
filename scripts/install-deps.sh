#!/usr/bin/env bash
# Installs every Debian package heavykv needs to build, test and run, and nothing else.
# The single source of truth for dependencies: the README, .ci/run and the Dockerfile call it.
# Usage: scripts/install-deps.sh [--runtime] [--cuda]
#   --runtime  only the shared libraries needed to run (the container's runtime stage)
#   --cuda     also the CUDA toolkit (or, with --runtime, its libraries) for -DHEAVYKV_CUDA=ON;
#              Debian ships them in the contrib and non-free components, which must be enabled
set -euo pipefail

BUILD_PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev prometheus-cpp-dev libcpp-httplib-dev
  libboost-dev              # header-only Boost.Beast + Asio: the event-driven HTTP front (server/http/)
  nlohmann-json3-dev        # header-only: heavykv inspect --json
  libpcre2-dev              # BPE pre-tokenizer regular expressions (engine/tokenizer/bpe_pretokenizer.cc)
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-grpcio python3-protobuf
  python3-jinja2            # reference renderer for the chat-template tests (tests/chat/)
  python3-yaml prometheus   # deploy checks: YAML parsing, promtool
  python3-jsonschema        # deploy checks: the rendered manifests against deploy/schemas
  openssl                   # tests/server/security_e2e_test.cc makes its CA and certificates
  curl                      # tests/deploy/check_readme.py runs the README's curl commands
  clang libclang-rt-14-dev libomp-dev  # sanitizer + libFuzzer build (scripts/test-sanitizers.sh)
)
RUNTIME_PKGS=(
  libgrpc++1.51 libprotobuf32 libabsl20220623 libspdlog1.10 libfmt9
  libprometheus-cpp-core1.0 libcpp-httplib0.11 libopenblas0-pthread libgomp1 libpcre2-8-0
)
CUDA_PKGS=(nvidia-cuda-toolkit nvidia-cuda-toolkit-gcc)
CUDA_RUNTIME_PKGS=(libcudart11.0 libcublaslt11)

runtime=0 cuda=0
for arg in "$@"; do
  case "$arg" in
    --runtime) runtime=1 ;;
    --cuda) cuda=1 ;;
    *) echo "usage: scripts/install-deps.sh [--runtime] [--cuda]" >&2; exit 2 ;;
  esac
done

if ((runtime)); then PKGS=("${RUNTIME_PKGS[@]}"); else PKGS=("${BUILD_PKGS[@]}"); fi
if ((cuda)); then
  if ((runtime)); then PKGS+=("${CUDA_RUNTIME_PKGS[@]}"); else PKGS+=("${CUDA_PKGS[@]}"); fi
fi
# `kubectl kustomize` renders deploy/k8s in the tests: Debian's kubectl unless one is on PATH.
if ((!runtime)) && ! command -v kubectl >/dev/null; then PKGS+=(kubernetes-client); fi
# The OpenAI Node client test (tests/openai_node) needs node and npm: Debian's unless they are on
# PATH (a NodeSource nodejs carries its own npm, which Debian's npm package would conflict with).
if ((!runtime)) && ! { command -v node >/dev/null && command -v npm >/dev/null; }; then
  PKGS+=(nodejs npm)
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # The tests need only promtool from the prometheus package; its daemon would take port 9090,
  # heavykv serve's default metrics port. Stop it where systemd started it.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [[ -d /run/systemd/system ]]; then
    $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  fi
fi

#!/usr/bin/env bash
# Builds the CUDA binaries here (build-gpu/, Release, HEAVYKV_CUDA=ON) and packs what
# scripts/gpu-check.sh --prebuilt needs on a GPU machine that has the CUDA toolkit's libraries but
# no network and none of our Debian packages:
#   DEST/bin         heavykv, heavykv_bench and the five cuda_* test binaries, stripped
#   DEST/lib         libheavykv_cuda.so and every shared library they load that is neither the C
#                    runtime (libc, libm, ld-linux, libstdc++, libgcc_s) nor CUDA's (libcuda,
#                    libcudart, libcublas*): gRPC, protobuf, abseil, OpenBLAS, ...
#   DEST/lib/compat  this machine's libstdc++ and libgcc_s, used only where the GPU machine's are
#                    older
#   DEST/SOURCE_DIR  the source directory compiled into the binaries (they read models/ there)
#   DEST/MANIFEST    commit, date, nvcc version
#   DEST/gpu-check.sh  this checkout's copy, so the GPU machine runs it even from an older checkout
# With TARBALL, also packs DEST's contents into TARBALL (gzip; ~23 MB, against 66 MB unpacked, most
# of it OpenBLAS): for a tool that carries at most 64 MiB to the GPU machine.
# Usage: scripts/gpu-bundle.sh DEST [TARBALL]
#   HEAVYKV_JOBS, default 2; HEAVYKV_CUDA_ARCHS, default 90-real: the H200 (Hopper) only, half the
#   nvcc time of the project's default "80-real 90-real"
# Then, on the GPU machine, from the root of a checkout with DEST inside it (e.g. build-gpu/):
#   bash DEST/gpu-check.sh --prebuilt DEST OUTDIR
# (from a tarball: mkdir -p build-gpu && tar xzf TARBALL -C build-gpu, then the same with
# DEST = build-gpu). kernels/cuda/README.md has the whole recipe.
set -euo pipefail
DEST=${1:?usage: scripts/gpu-bundle.sh DEST [TARBALL]}
TARBALL=${2:-}
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TARGETS=(heavykv heavykv_bench cuda_kernels_test cuda_cuda_model_runner_test cuda_eviction_rule_test
  cuda_quant_gemv_test cuda_gpu_weight_plan_test)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHEAVYKV_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${HEAVYKV_CUDA_ARCHS:-90-real}" > /dev/null
cmake --build build-gpu -j "${HEAVYKV_JOBS:-2}" --target heavykv_cuda "${TARGETS[@]}"

mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
[[ "$DEST" != "$ROOT/build-gpu" ]] || { echo "DEST must not be build-gpu itself" >&2; exit 1; }
rm -rf "$DEST/bin" "$DEST/lib"
mkdir -p "$DEST/bin" "$DEST/lib"
for t in "${TARGETS[@]}"; do strip -o "$DEST/bin/$t" "build-gpu/bin/$t"; done
strip --strip-unneeded -o "$DEST/lib/libheavykv_cuda.so" build-gpu/lib/libheavykv_cuda.so
# The libraries the loader resolves here, minus the C runtime and CUDA's (the GPU machine's own).
system='^(linux-vdso|libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libstdc\+\+|libgcc_s'
system+='|libcuda|libcudart|libcublas|libcublasLt)\.so'
for f in "$DEST"/bin/* "$DEST/lib/libheavykv_cuda.so"; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $system ]] || cp -L "$path" "$DEST/lib/$name"
done
strip --strip-unneeded "$DEST"/lib/*.so* 2>/dev/null || true
# This machine's libstdc++ and libgcc_s, for a GPU machine whose own are older (gpu-check.sh puts
# lib/compat on the library path only when the binaries' GLIBCXX versions are not found there).
mkdir -p "$DEST/lib/compat"
for name in libstdc++.so.6 libgcc_s.so.1; do
  cp -L "$(ldd "$DEST/bin/heavykv" | awk -v n="$name" '$1 == n {print $3}')" "$DEST/lib/compat/"
done
echo "$ROOT" > "$DEST/SOURCE_DIR"
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo +changes)," \
  "built $(date -u +%FT%TZ), $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' ||
  /usr/local/cuda/bin/nvcc --version | grep -o 'release [0-9.]*')" > "$DEST/MANIFEST"
cp scripts/gpu-check.sh "$DEST/gpu-check.sh"
echo "bundle $DEST: $(du -sh "$DEST" | cut -f1); $(cat "$DEST/MANIFEST")"
if [[ -n "$TARBALL" ]]; then
  tar czf "$TARBALL" -C "$DEST" bin lib SOURCE_DIR MANIFEST gpu-check.sh
  echo "tarball $TARBALL: $(du -sh "$TARBALL" | cut -f1)"
fi

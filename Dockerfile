# heavykv container image: `heavykv serve` on the bundled model (docs/DEPLOY.md).
#
#   docker build -t heavykv:cpu .                                   # CPU backend
#   docker build -t heavykv:gpu --build-arg HEAVYKV_CUDA=ON .       # + the CUDA backend
#   docker run --rm -p 50051:50051 -p 8000:8000 -p 9090:9090 heavykv:cpu [serve flags...]
#   docker run --rm --gpus all -p 50051:50051 -p 8000:8000 -p 9090:9090 heavykv:gpu --device cuda \
#     --model /opt/heavykv/models/stories260K.bin --tokenizer /opt/heavykv/models/tok512.bin
#
# The build stage runs the README's own scripts (scripts/install-deps.sh, scripts/build.sh); the
# runtime stage installs only `install-deps.sh --runtime`. Extra `docker run` arguments replace
# CMD, so pass --model/--tokenizer/--listen/--http-address/--metrics-address again when you give
# any. Ports: 50051 gRPC, 8000 the OpenAI HTTP API, 9090 metrics.
# CI has no Docker engine: tests/deploy/check_dockerfile.py checks this file without one.

# ON: build with -DHEAVYKV_CUDA=ON against Debian's CUDA toolkit (contrib + non-free) and ship
# its runtime libraries; the NVIDIA container toolkit provides the driver at run time
# (`docker run --gpus all`, or the device plugin on Kubernetes).
ARG HEAVYKV_CUDA=OFF

FROM debian:bookworm AS build
ARG HEAVYKV_CUDA
ARG HEAVYKV_JOBS=2
WORKDIR /src
COPY scripts/install-deps.sh scripts/
RUN if [ "$HEAVYKV_CUDA" = ON ]; then \
      sed -i 's/^Components: main$/Components: main contrib non-free/' \
        /etc/apt/sources.list.d/debian.sources; \
      bash scripts/install-deps.sh --cuda; \
    else \
      bash scripts/install-deps.sh; \
    fi \
    && rm -rf /var/lib/apt/lists/*
COPY . .
# Debian's nvcc (CUDA 11.8) needs GCC 11 for host code: cuda-g++ (nvidia-cuda-toolkit-gcc).
RUN extra=""; if [ "$HEAVYKV_CUDA" = ON ]; then extra=-DCMAKE_CUDA_HOST_COMPILER=cuda-g++; fi; \
    HEAVYKV_BUILD_DIR=/build bash scripts/build.sh -DHEAVYKV_CUDA="$HEAVYKV_CUDA" $extra \
      -DHEAVYKV_BUILD_TESTS=OFF -DHEAVYKV_BUILD_BENCH=OFF

FROM debian:bookworm-slim AS runtime
ARG HEAVYKV_CUDA
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN if [ "$HEAVYKV_CUDA" = ON ]; then \
      sed -i 's/^Components: main$/Components: main contrib non-free/' \
        /etc/apt/sources.list.d/debian.sources; \
      bash /tmp/install-deps.sh --runtime --cuda; \
    else \
      bash /tmp/install-deps.sh --runtime; \
    fi \
    && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh \
    && groupadd --system --gid 10001 heavykv \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin heavykv
# The engine runs BLAS single-threaded inside its OpenMP pool (kernels/cpu/gemm.cc); this spares
# the idle worker threads OpenBLAS would otherwise start when the library loads.
ENV OPENBLAS_NUM_THREADS=1
COPY --from=build /build/bin/heavykv /usr/local/bin/heavykv
COPY models/ /opt/heavykv/models/
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
EXPOSE 50051 8000 9090
ENTRYPOINT ["heavykv", "serve"]
CMD ["--model", "/opt/heavykv/models/stories260K.bin", \
     "--tokenizer", "/opt/heavykv/models/tok512.bin", \
     "--listen", "0.0.0.0:50051", "--http-address", "0.0.0.0:8000", \
     "--metrics-address", "0.0.0.0:9090"]

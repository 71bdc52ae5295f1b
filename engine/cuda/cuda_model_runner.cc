#include "engine/cuda/cuda_model_runner.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <variant>

#include "absl/strings/str_cat.h"
#include "engine/cuda/device_step.h"
#include "engine/cuda/gpu_weight_plan.h"
#include "engine/cuda/step_layout.h"
#include "kernels/cuda/device_kv.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/evict.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/kv_append.cuh"
#include "kernels/cuda/paged_attention.cuh"
#include "kernels/cuda/quant_dequant.cuh"
#include "kernels/cuda/quant_gemv.cuh"
#include "kernels/cuda/qkv_bias_norm.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/synthetic_kv.cuh"

namespace heavykv {
namespace {

using cuda::bf16;

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt
constexpr int64_t kAlign = 256;
constexpr int64_t kMinReserveBytes = int64_t(1) << 30;
// --gpu-weights quantized: steps of at most this many tokens multiply quantized parts with
// QuantGemv (tiles of cuda::kQuantGemvTile); larger ones dequantize slabs of rows into a bf16
// scratch of at most kQuantScratchBytes and call the cuBLASLt GEMM. A guess until measured on a
// GPU; HEAVYKV_CUDA_QUANT_GEMV_MAX overrides it.
constexpr int64_t kQuantGemvMaxTokens = 32;
constexpr int64_t kQuantScratchBytes = int64_t(64) << 20;

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a sticky launch error where the runtime allows it
  if (e == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of GPU memory"));
  }
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": cuBLASLt status ", static_cast<int>(s)));
}

#define HEAVYKV_RETURN_IF_ERROR(expr)        \
  do {                                       \
    absl::Status s_ = (expr);                \
    if (!s_.ok()) return s_;                 \
  } while (0)
#define HEAVYKV_CUDA_RETURN(expr) HEAVYKV_RETURN_IF_ERROR(CudaStatus((expr), #expr))

// A device allocation that grows (contents are not kept); the stream must be idle when it does.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  absl::Status Reserve(int64_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_) return absl::OkStatus();
    HEAVYKV_CUDA_RETURN(cudaStreamSynchronize(stream));
    const int64_t want = std::max<int64_t>(bytes, bytes_ + bytes_ / 2);
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    cudaError_t e = cudaMalloc(&ptr_, want);
    if (e != cudaSuccess) {
      ptr_ = nullptr;
      return CudaStatus(e, "activation buffer");
    }
    bytes_ = want;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// Pinned host memory that grows.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  absl::Status Reserve(int64_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    const int64_t want = std::max<int64_t>(bytes, 4096);
    HEAVYKV_CUDA_RETURN(cudaMallocHost(&ptr_, want));
    bytes_ = want;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

int64_t AlignUp(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// One matrix on the device: blocks of its rows, each bf16 (row-major) or kept in a GGUF block
// format (GpuWeightPlan says which).
struct DevicePart {
  int64_t row0 = 0, rows = 0;
  const bf16* bf16_rows = nullptr;   // [rows][cols] when bf16
  cuda::QuantMatrixView quant;       // else the blocks
};
struct DeviceMatrix {
  std::vector<DevicePart> parts;
  int64_t rows = 0, cols = 0;
};

}  // namespace

struct CudaModelRunner::Impl {
  const Model& model;
  KvCache* cache;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  cudaEvent_t meta_free = nullptr;  // the last upload of the staging buffer has been read
  int num_sms = 1;
  bool broken = false;

  // Weights: one allocation, each tensor 256-byte aligned.
  DeviceBuffer weights, workspace;
  struct Layer {
    DeviceMatrix wqkv, wo, w13, w2;
    float *rms_att, *rms_ffn;
    float* bqkv;            // [qkv_dim] or null (no attention bias)
    float *q_norm, *k_norm;  // [head_dim] each, or null (no q/k norm)
  };
  std::vector<Layer> layers;
  DeviceMatrix classifier, embedding;
  float* rms_final = nullptr;
  DeviceBuffer rope_freq;  // [head_dim / 2] cuda::RopeInvFreq of the model's theta and factors
  GpuWeightPlan weight_plan;
  int64_t quant_gemv_max = kQuantGemvMaxTokens;
  DeviceBuffer quant_scratch;  // bf16 slabs of quantized rows for steps of many tokens

  // The pool.
  DeviceBuffer pool_kv, pool_pos, pool_score;
  cuda::DeviceKvPool pool;

  // Per step.
  DeviceBuffer x, xb, qkv, att, hb, hb2, logits, part_out, part_ml, part_e, meta, error;
  HostBuffer h_meta, h_logits, h_error;
  StepLayout layout;
  std::vector<EvictRule> rules;

  Impl(const Model& m, KvCache* c, const StepRunnerOptions& o) : model(m), cache(c), options(o) {}
  const StepRunnerOptions options;
  ~Impl() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (lt != nullptr) cuda::DestroyGemmHandle(lt);
    if (meta_free != nullptr) cudaEventDestroy(meta_free);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  absl::Status Init();
  absl::Status UploadWeights();
  // y[m][ldy] (+)= x[m][w.cols] W^T, part by part into its block of output columns.
  absl::Status Multiply(const DeviceMatrix& w, const bf16* x, float* y, int64_t m, int64_t ldy,
                        bool accumulate, const char* what);
  absl::Status EmbedTokens(const int32_t* tokens, float* out, int64_t T);
  absl::Status Prepare(std::span<const SequenceStep> steps, int64_t T, int64_t rows);
  absl::Status Enqueue();
  absl::Status Run(std::span<const SequenceStep> steps, bool copy_logits);
};

absl::Status CheckCudaDevice() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("--device cuda: no CUDA device (", cudaGetErrorString(e), ")"));
  }
  if (n == 0) return absl::FailedPreconditionError("--device cuda: no CUDA device");
  return absl::OkStatus();
}

bool HasCudaDevice() { return CheckCudaDevice().ok(); }

absl::StatusOr<int64_t> CudaWeightBytes(const Model& model, const StepRunnerOptions& options) {
  absl::StatusOr<GpuWeightPlan> plan = PlanGpuWeights(model, options.gpu_weights);
  if (!plan.ok()) return plan.status();
  return plan->total_bytes;
}

absl::StatusOr<int32_t> CudaDefaultKvPages(const Model& model, const KvShape& shape,
                                           const StepRunnerOptions& options) {
  HEAVYKV_RETURN_IF_ERROR(CheckCudaDevice());
  absl::StatusOr<int64_t> weight_bytes = CudaWeightBytes(model, options);
  if (!weight_bytes.ok()) return weight_bytes.status();
  size_t free_bytes = 0, total_bytes = 0;
  HEAVYKV_CUDA_RETURN(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t reserve = std::max<int64_t>(kMinReserveBytes, int64_t(total_bytes) / 10);
  const int64_t weights = *weight_bytes;
  const int64_t left = int64_t(free_bytes) - weights - reserve;
  if (left < shape.PageBytes()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the GPU has ", free_bytes >> 20, " MiB free: the weights take ", weights >> 20,
        " MiB and the reserve ", reserve >> 20, " MiB, leaving no room for the KV pool"));
  }
  return static_cast<int32_t>(std::min<int64_t>(INT32_MAX, left / shape.PageBytes()));
}

absl::Status CudaModelRunner::Impl::Init() {
  const ModelConfig& c = model.config;
  const KvShape& s = cache->shape();
  if (cache->storage() != KvStorage::kExternal || s.element_bytes != 2 || s.table_per_layer ||
      s.quant != KvQuant::kNone) {
    return absl::InvalidArgumentError(
        "the CUDA runner needs a KV cache with external bf16 storage and one table for all "
        "layers (CreateKvCache(kCuda, KvShapeForDevice(kCuda, ...)))");
  }
  if (s.num_layers != c.num_layers || s.num_kv_heads != c.num_kv_heads ||
      s.head_dim != c.head_dim()) {
    return absl::InvalidArgumentError("the KV cache's shape does not match the model");
  }
  const int32_t hd = c.head_dim();
  if (hd % 8 != 0 || hd > cuda::kAttentionMaxHeadDim || c.group_size() > cuda::kAttentionMaxGroup) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA kernels take head_dim a multiple of 8 up to ", cuda::kAttentionMaxHeadDim,
        " and at most ", cuda::kAttentionMaxGroup, " query heads per kv head; this model has ",
        hd, " and ", c.group_size(), "; use --device cpu"));
  }
  // Refusals of the weight plan (a block format without a kernel) come before any device work.
  absl::StatusOr<GpuWeightPlan> p = PlanGpuWeights(model, options.gpu_weights);
  if (!p.ok()) return p.status();
  weight_plan = *std::move(p);
  if (const char* v = std::getenv("HEAVYKV_CUDA_QUANT_GEMV_MAX"); v != nullptr && *v) {
    quant_gemv_max = std::max<int64_t>(0, std::atoll(v));
  }
  HEAVYKV_RETURN_IF_ERROR(CheckCudaDevice());
  int device = 0;
  HEAVYKV_CUDA_RETURN(cudaGetDevice(&device));
  HEAVYKV_CUDA_RETURN(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  HEAVYKV_CUDA_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  HEAVYKV_CUDA_RETURN(cudaEventCreateWithFlags(&meta_free, cudaEventDisableTiming));
  HEAVYKV_RETURN_IF_ERROR(LtStatus(cuda::CreateGemmHandle(&lt), "loading cuBLASLt"));
  HEAVYKV_RETURN_IF_ERROR(workspace.Reserve(kWorkspaceBytes, stream));
  if (!model.rope_freqs.empty() && int64_t(model.rope_freqs.size()) != hd / 2) {
    return absl::InvalidArgumentError("the model's rope frequency factors are not head_dim / 2");
  }
  HEAVYKV_RETURN_IF_ERROR(UploadWeights());
  const std::vector<float> freq = cuda::RopeInvFreq(
      hd, c.rope_theta, model.rope_freqs.empty() ? nullptr : model.rope_freqs.data());
  HEAVYKV_RETURN_IF_ERROR(rope_freq.Reserve(int64_t(freq.size() * sizeof(float)), stream));
  HEAVYKV_CUDA_RETURN(cudaMemcpy(rope_freq.as<float>(), freq.data(), freq.size() * sizeof(float),
                                 cudaMemcpyHostToDevice));

  const int64_t pages = cache->allocator().num_pages_total();
  pool.num_layers = s.num_layers;
  pool.num_kv_heads = s.num_kv_heads;
  pool.head_dim = s.head_dim;
  pool.block_size = s.block_size;
  HEAVYKV_RETURN_IF_ERROR(pool_kv.Reserve(pages * pool.PageElems() * int64_t(sizeof(bf16)), stream));
  HEAVYKV_RETURN_IF_ERROR(pool_pos.Reserve(pages * pool.PageMeta() * int64_t(sizeof(int32_t)), stream));
  HEAVYKV_RETURN_IF_ERROR(pool_score.Reserve(pages * pool.PageMeta() * int64_t(sizeof(float)), stream));
  pool.kv = pool_kv.as<bf16>();
  pool.pos = pool_pos.as<int32_t>();
  pool.score = pool_score.as<float>();
  HEAVYKV_CUDA_RETURN(cudaMemsetAsync(pool.pos, 0, pool_pos.bytes(), stream));
  HEAVYKV_CUDA_RETURN(cudaMemsetAsync(pool.score, 0, pool_score.bytes(), stream));
  HEAVYKV_RETURN_IF_ERROR(error.Reserve(sizeof(int32_t), stream));
  HEAVYKV_CUDA_RETURN(cudaMemsetAsync(error.as<int32_t>(), 0, sizeof(int32_t), stream));
  HEAVYKV_RETURN_IF_ERROR(h_error.Reserve(sizeof(int32_t)));
  HEAVYKV_CUDA_RETURN(cudaEventRecord(meta_free, stream));
  return CudaStatus(cudaStreamSynchronize(stream), "initialising the CUDA runner");
}

absl::Status CudaModelRunner::Impl::UploadWeights() {
  // The plan (GpuWeightPlan, made in Init) placed every tensor; upload each through host staging.
  HEAVYKV_RETURN_IF_ERROR(
      weights.Reserve(std::max<int64_t>(weight_plan.total_bytes, kAlign), stream));
  char* base = weights.as<char>();
  std::vector<float> rowmajor;
  std::vector<bf16> half;
  auto upload_part = [&](const GpuPart& p) -> absl::Status {
    if (p.quantized()) {  // the file's blocks, byte for byte
      const auto& q = std::get<cpu::QuantMatrix>(p.linear->parts()[p.part_index]);
      HEAVYKV_CUDA_RETURN(cudaMemcpy(base + p.offset, q.row(0), q.bytes(), cudaMemcpyHostToDevice));
      return absl::OkStatus();
    }
    const int64_t n = p.rows * p.cols;
    rowmajor.resize(n);
    if (p.part_index < 0) {
      p.linear->ToRowMajor(rowmajor.data());
    } else if (const auto* pm = std::get_if<cpu::PackedMatrix>(&p.linear->parts()[p.part_index])) {
      pm->ToRowMajor(rowmajor.data());
    } else {
      const auto& q = std::get<cpu::QuantMatrix>(p.linear->parts()[p.part_index]);
      for (int64_t r = 0; r < p.rows; ++r) q.DequantizeRowTo(r, rowmajor.data() + r * p.cols);
    }
    half.resize(n);
    for (int64_t i = 0; i < n; ++i) half[i] = __float2bfloat16_rn(rowmajor[i]);
    HEAVYKV_CUDA_RETURN(cudaMemcpy(base + p.offset, half.data(), n * 2, cudaMemcpyHostToDevice));
    return absl::OkStatus();
  };
  auto matrix = [&](const GpuMatrixPlan& mp, DeviceMatrix* out, bool upload) -> absl::Status {
    out->rows = mp.rows;
    out->cols = mp.cols;
    out->parts.clear();
    for (const GpuPart& p : mp.parts) {
      if (upload) HEAVYKV_RETURN_IF_ERROR(upload_part(p));
      DevicePart d;
      d.row0 = p.row0;
      d.rows = p.rows;
      if (p.quantized()) {
        d.quant.data = reinterpret_cast<const uint8_t*>(base + p.offset);
        d.quant.type = static_cast<cuda::QuantBlockType>(p.format);
        d.quant.rows = p.rows;
        d.quant.cols = p.cols;
        d.quant.row_bytes = p.row_bytes;
      } else {
        d.bf16_rows = reinterpret_cast<const bf16*>(base + p.offset);
      }
      out->parts.push_back(d);
    }
    return absl::OkStatus();
  };
  auto floats = [&](const GpuFloats& f) -> absl::StatusOr<float*> {
    if (f.offset < 0) return nullptr;
    HEAVYKV_CUDA_RETURN(cudaMemcpy(base + f.offset, f.data, f.count * sizeof(float),
                                   cudaMemcpyHostToDevice));
    return reinterpret_cast<float*>(base + f.offset);
  };
  layers.clear();
  for (const GpuLayerPlan& o : weight_plan.layers) {
    Layer l;
    HEAVYKV_RETURN_IF_ERROR(matrix(o.wqkv, &l.wqkv, true));
    HEAVYKV_RETURN_IF_ERROR(matrix(o.wo, &l.wo, true));
    HEAVYKV_RETURN_IF_ERROR(matrix(o.w13, &l.w13, true));
    HEAVYKV_RETURN_IF_ERROR(matrix(o.w2, &l.w2, true));
    for (auto [slot, f] : {std::pair{&l.rms_att, &o.rms_att}, {&l.rms_ffn, &o.rms_ffn},
                           {&l.bqkv, &o.bqkv}, {&l.q_norm, &o.q_norm}, {&l.k_norm, &o.k_norm}}) {
      absl::StatusOr<float*> p = floats(*f);
      if (!p.ok()) return p.status();
      *slot = *p;
    }
    layers.push_back(std::move(l));
  }
  HEAVYKV_RETURN_IF_ERROR(matrix(weight_plan.classifier, &classifier, true));
  HEAVYKV_RETURN_IF_ERROR(
      matrix(weight_plan.embedding, &embedding, !weight_plan.embedding_is_classifier));
  absl::StatusOr<float*> fin = floats(weight_plan.rms_final);
  if (!fin.ok()) return fin.status();
  rms_final = *fin;
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Impl::Multiply(const DeviceMatrix& w, const bf16* x, float* y,
                                             int64_t m, int64_t ldy, bool accumulate,
                                             const char* what) {
  const int64_t k = w.cols;
  void* ws = workspace.as<void>();
  for (const DevicePart& p : w.parts) {
    float* yp = y + p.row0;
    if (p.bf16_rows != nullptr) {
      HEAVYKV_RETURN_IF_ERROR(LtStatus(cuda::GemmBf16(lt, ws, kWorkspaceBytes, x, p.bf16_rows, yp,
                                                      m, p.rows, k, ldy, accumulate, stream),
                                       what));
    } else if (m <= quant_gemv_max) {
      for (int64_t t0 = 0; t0 < m; t0 += cuda::kQuantGemvTile) {
        const int64_t mt = std::min<int64_t>(cuda::kQuantGemvTile, m - t0);
        HEAVYKV_CUDA_RETURN(
            cuda::QuantGemv(p.quant, x + t0 * k, yp + t0 * ldy, mt, ldy, accumulate, stream));
      }
    } else {
      // Slabs of rows dequantized to bf16 (Prepare sized the scratch), then tensor cores.
      const int64_t slab = std::max<int64_t>(
          64, quant_scratch.bytes() / (k * int64_t(sizeof(bf16))) / 64 * 64);
      bf16* scratch = quant_scratch.as<bf16>();
      for (int64_t r0 = 0; r0 < p.rows; r0 += slab) {
        const int64_t n = std::min(slab, p.rows - r0);
        HEAVYKV_CUDA_RETURN(cuda::DequantizeBf16(p.quant, r0, n, scratch, stream));
        HEAVYKV_RETURN_IF_ERROR(LtStatus(cuda::GemmBf16(lt, ws, kWorkspaceBytes, x, scratch,
                                                        yp + r0, m, n, k, ldy, accumulate, stream),
                                         what));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Impl::EmbedTokens(const int32_t* tokens, float* out, int64_t T) {
  const DevicePart& p = embedding.parts.front();  // the plan gives the table one part
  if (p.bf16_rows != nullptr) {
    HEAVYKV_CUDA_RETURN(cuda::Embedding(p.bf16_rows, tokens, out, T, embedding.cols, stream));
  } else {
    HEAVYKV_CUDA_RETURN(cuda::QuantEmbedding(p.quant, tokens, out, T, stream));
  }
  return absl::OkStatus();
}

// Sizes every buffer for the step and stages its plan; nothing is enqueued yet.
absl::Status CudaModelRunner::Impl::Prepare(std::span<const SequenceStep> steps, int64_t T,
                                            int64_t rows) {
  const ModelConfig& c = model.config;
  const int64_t dim = c.dim, hid = c.hidden_dim;
  HEAVYKV_RETURN_IF_ERROR(BuildStepLayout(steps, rules, cache->shape().block_size, &layout));
  const cuda::AttentionPlan plan = cuda::PlanAttention(
      layout.num_tokens, c.num_kv_heads, c.group_size(), c.head_dim(), layout.max_held,
      layout.any_scores, num_sms);
  auto f = [](int64_t n) { return n * int64_t(sizeof(float)); };
  auto h = [](int64_t n) { return n * int64_t(sizeof(bf16)); };
  HEAVYKV_RETURN_IF_ERROR(x.Reserve(f(T * dim), stream));
  HEAVYKV_RETURN_IF_ERROR(xb.Reserve(h(T * dim), stream));
  HEAVYKV_RETURN_IF_ERROR(qkv.Reserve(f(T * c.qkv_dim()), stream));
  HEAVYKV_RETURN_IF_ERROR(att.Reserve(h(T * c.q_dim()), stream));
  HEAVYKV_RETURN_IF_ERROR(hb.Reserve(f(T * 2 * hid), stream));
  HEAVYKV_RETURN_IF_ERROR(hb2.Reserve(h(T * hid), stream));
  HEAVYKV_RETURN_IF_ERROR(logits.Reserve(f(rows * c.vocab_size), stream));
  if (weight_plan.mode == GpuWeights::kQuantized && T > quant_gemv_max) {
    // The largest slab any quantized part needs: all its rows, or kQuantScratchBytes' worth (at
    // least 64 rows) of its widest.
    int64_t want = 0;
    auto need = [&](const DeviceMatrix& w) {
      for (const DevicePart& p : w.parts) {
        if (p.bf16_rows != nullptr) continue;
        const int64_t row = w.cols * int64_t(sizeof(bf16));
        want = std::max(want, std::min(p.rows * row, std::max(kQuantScratchBytes, 64 * row)));
      }
    };
    for (const Layer& l : layers) {
      for (const DeviceMatrix* w : {&l.wqkv, &l.wo, &l.w13, &l.w2}) need(*w);
    }
    need(classifier);
    HEAVYKV_RETURN_IF_ERROR(quant_scratch.Reserve(want, stream));
  }
  HEAVYKV_RETURN_IF_ERROR(part_out.Reserve(f(std::max<int64_t>(1, plan.part_out_floats)), stream));
  HEAVYKV_RETURN_IF_ERROR(part_ml.Reserve(f(std::max<int64_t>(1, plan.part_ml_floats)), stream));
  HEAVYKV_RETURN_IF_ERROR(part_e.Reserve(f(std::max<int64_t>(1, plan.part_e_floats)), stream));
  const int64_t meta_bytes = int64_t(layout.data.size()) * int64_t(sizeof(int32_t));
  HEAVYKV_RETURN_IF_ERROR(meta.Reserve(meta_bytes, stream));
  HEAVYKV_RETURN_IF_ERROR(h_logits.Reserve(f(rows * c.vocab_size)));
  // The previous step's upload must have left the staging buffer before it is rewritten.
  HEAVYKV_CUDA_RETURN(cudaEventSynchronize(meta_free));
  HEAVYKV_RETURN_IF_ERROR(h_meta.Reserve(meta_bytes));
  std::memcpy(h_meta.as<int32_t>(), layout.data.data(), meta_bytes);
  return absl::OkStatus();
}

absl::Status CudaModelRunner::Impl::Enqueue() {
  const ModelConfig& c = model.config;
  const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), qkv_dim = c.qkv_dim(),
                hid = c.hidden_dim;
  const int64_t T = layout.num_tokens, rows = layout.num_rows;
  const float eps = c.rms_norm_eps;
  const bool neox = c.rope_style == RopeStyle::kNeox;
  const int32_t* d_meta = meta.as<int32_t>();
  HEAVYKV_CUDA_RETURN(cudaMemcpyAsync(meta.as<int32_t>(), h_meta.as<int32_t>(),
                                      layout.data.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream));
  HEAVYKV_CUDA_RETURN(cudaEventRecord(meta_free, stream));
  const cuda::DeviceStep step = DeviceStepAt(layout, d_meta);
  const cuda::AttentionPlan plan = cuda::PlanAttention(
      layout.num_tokens, c.num_kv_heads, c.group_size(), c.head_dim(), layout.max_held,
      layout.any_scores, num_sms);
  bool evicts = false;
  for (int32_t i = 0; i < layout.num_seqs; ++i) {
    evicts = evicts || layout.data[layout.evict_kind + i] != 0;
  }

  float* xf = x.as<float>();
  bf16* xbh = xb.as<bf16>();
  float* qkvf = qkv.as<float>();
  bf16* atth = att.as<bf16>();
  float* hbf = hb.as<float>();
  bf16* hb2h = hb2.as<bf16>();
  HEAVYKV_RETURN_IF_ERROR(EmbedTokens(d_meta + layout.tokens, xf, T));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const Layer& w = layers[l];
    HEAVYKV_CUDA_RETURN(cuda::RmsNorm(xf, w.rms_att, xbh, T, dim, eps, nullptr, stream));
    HEAVYKV_RETURN_IF_ERROR(Multiply(w.wqkv, xbh, qkvf, T, qkv_dim, false, "qkv GEMM"));
    if (w.bqkv != nullptr || w.q_norm != nullptr) {  // Qwen2's biases, Qwen3's q/k norms
      HEAVYKV_CUDA_RETURN(cuda::QkvBiasNorm(qkvf, T, qkv_dim, w.bqkv, w.q_norm, w.k_norm,
                                            c.num_heads, c.num_kv_heads, c.head_dim(), eps,
                                            stream));
    }
    HEAVYKV_CUDA_RETURN(cuda::RopeKvAppend(pool, step, l, qkvf, qkv_dim, q_dim, q_dim + kv_dim,
                                           rope_freq.as<float>(), neox, stream));
    cuda::AttentionArgs a;
    a.pool = pool;
    a.step = step;
    a.layer = l;
    a.group = c.group_size();
    a.q = qkvf;
    a.q_stride = qkv_dim;
    a.out = atth;
    a.out_stride = q_dim;
    a.part_out = part_out.as<float>();
    a.part_ml = part_ml.as<float>();
    a.part_e = part_e.as<float>();
    HEAVYKV_CUDA_RETURN(cuda::PagedAttention(a, plan, stream));
    if (evicts) {
      HEAVYKV_CUDA_RETURN(
          cuda::EvictLayer(pool, step, l, layout.max_held, error.as<int32_t>(), stream));
    }
    HEAVYKV_RETURN_IF_ERROR(Multiply(w.wo, atth, xf, T, dim, true, "output projection GEMM"));
    HEAVYKV_CUDA_RETURN(cuda::RmsNorm(xf, w.rms_ffn, xbh, T, dim, eps, nullptr, stream));
    HEAVYKV_RETURN_IF_ERROR(Multiply(w.w13, xbh, hbf, T, 2 * hid, false, "gate/up GEMM"));
    HEAVYKV_CUDA_RETURN(cuda::SwiGlu(hbf, hb2h, T, hid, stream));
    HEAVYKV_RETURN_IF_ERROR(Multiply(w.w2, hb2h, xf, T, dim, true, "down projection GEMM"));
  }
  HEAVYKV_CUDA_RETURN(
      cuda::RmsNorm(xf, rms_final, xbh, rows, dim, eps, d_meta + layout.logit_rows, stream));
  return Multiply(classifier, xbh, logits.as<float>(), rows, c.vocab_size, false,
                  "classifier GEMM");
}

absl::Status CudaModelRunner::Impl::Run(std::span<const SequenceStep> steps, bool copy_logits) {
  if (broken) {
    return absl::FailedPreconditionError("the CUDA runner failed earlier and cannot run");
  }
  int64_t T = 0, rows = 0;
  HEAVYKV_RETURN_IF_ERROR(ValidateSteps(model.config, steps, &T, &rows));
  if (T > INT32_MAX / 2) return absl::InvalidArgumentError("too many tokens in one step");
  rules.resize(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::StatusOr<EvictRule> r = EvictRuleFor(steps[i].kv->policy, steps[i].kv->budget);
    if (!r.ok()) return r.status();
    rules[i] = *r;
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::Status s = cache->Reserve(*steps[i].kv, steps[i].tokens.size());
    if (!s.ok()) {
      for (size_t j = 0; j < i; ++j) cache->Unreserve(*steps[j].kv);
      return s;
    }
  }
  absl::Status s = Prepare(steps, T, rows);
  if (s.ok()) s = Enqueue();
  if (!s.ok()) {
    // Nothing was committed: give the reservations back. A device error leaves the runner unusable.
    for (const SequenceStep& st : steps) cache->Unreserve(*st.kv);
    if (!absl::IsResourceExhausted(s)) broken = true;
    return s;
  }
  for (const SequenceStep& st : steps) {
    cache->CommitStep(*st.kv, static_cast<int32_t>(st.tokens.size()));
  }
  if (!copy_logits) return absl::OkStatus();
  const ModelConfig& c = model.config;
  HEAVYKV_CUDA_RETURN(cudaMemcpyAsync(h_logits.as<float>(), logits.as<float>(),
                                      rows * c.vocab_size * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream));
  HEAVYKV_CUDA_RETURN(cudaMemcpyAsync(h_error.as<int32_t>(), error.as<int32_t>(), sizeof(int32_t),
                                      cudaMemcpyDeviceToHost, stream));
  cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) {
    broken = true;
    return CudaStatus(e, "CUDA step");
  }
  if (*h_error.as<int32_t>() != 0) {
    broken = true;
    return absl::InternalError("GPU eviction found fewer candidates than victims needed");
  }
  return absl::OkStatus();
}

CudaModelRunner::CudaModelRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModelRunner::~CudaModelRunner() = default;

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    const Model& model, KvCache* cache, const StepRunnerOptions& options) {
  auto impl = std::make_unique<Impl>(model, cache, options);
  HEAVYKV_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<CudaModelRunner>(new CudaModelRunner(std::move(impl)));
}

absl::StatusOr<std::span<const float>> CudaModelRunner::Forward(
    std::span<const SequenceStep> steps) {
  HEAVYKV_RETURN_IF_ERROR(impl_->Run(steps, /*copy_logits=*/true));
  return std::span<const float>(impl_->h_logits.as<float>(),
                                int64_t(impl_->layout.num_rows) * impl_->model.config.vocab_size);
}

absl::Status CudaModelRunner::ForwardOnDevice(std::span<const SequenceStep> steps) {
  return impl_->Run(steps, /*copy_logits=*/false);
}

absl::Status CudaModelRunner::Synchronize() {
  return CudaStatus(cudaStreamSynchronize(impl_->stream), "CUDA synchronize");
}

const Model& CudaModelRunner::model() const { return impl_->model; }
KvCache& CudaModelRunner::cache() { return *impl_->cache; }
absl::Status CudaModelRunner::SupportsPolicy(const EvictionPolicy* policy, KvQuant quant) const {
  if (quant != KvQuant::kNone) {
    return absl::UnimplementedError(
        "a request's own kv_dtype (int8, int4) has no CUDA implementation; use --device cpu");
  }
  return CheckGpuPolicy(policy);
}
int64_t CudaModelRunner::WeightBytes() const { return impl_->weight_plan.step_bytes; }

std::vector<std::pair<std::string, int64_t>> CudaModelRunner::DeviceWeightBytes() const {
  return impl_->weight_plan.bytes_by_format;
}

int64_t CudaModelRunner::DeviceBytes() const {
  const Impl& m = *impl_;
  int64_t total = 0;
  for (const DeviceBuffer* b : {&m.weights, &m.workspace, &m.pool_kv, &m.pool_pos, &m.pool_score,
                                &m.x, &m.xb, &m.qkv, &m.att, &m.hb, &m.hb2, &m.logits,
                                &m.part_out, &m.part_ml, &m.part_e, &m.meta, &m.error,
                                &m.quant_scratch}) {
    total += b->bytes();
  }
  return total;
}

absl::Status CudaModelRunner::FillSyntheticKv(SequenceKv& seq, int32_t num_slots, uint64_t seed) {
  if (seq.Slots(0) != 0) {
    return absl::InvalidArgumentError("FillSyntheticKv needs an empty sequence");
  }
  HEAVYKV_RETURN_IF_ERROR(impl_->cache->Reserve(seq, num_slots));
  const std::vector<int32_t>& pages = seq.Table(0).pages;
  HEAVYKV_RETURN_IF_ERROR(impl_->meta.Reserve(pages.size() * sizeof(int32_t), impl_->stream));
  HEAVYKV_CUDA_RETURN(cudaStreamSynchronize(impl_->stream));
  HEAVYKV_CUDA_RETURN(cudaMemcpy(impl_->meta.as<int32_t>(), pages.data(),
                                 pages.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  HEAVYKV_CUDA_RETURN(cuda::FillSyntheticKv(impl_->pool, impl_->meta.as<int32_t>(), num_slots,
                                            seed, impl_->stream));
  HEAVYKV_CUDA_RETURN(cudaStreamSynchronize(impl_->stream));
  impl_->cache->CommitStep(seq, num_slots);
  return absl::OkStatus();
}

absl::Status CudaModelRunner::ReadSlots(const SequenceKv& seq, int32_t layer, int32_t kv_head,
                                        std::vector<int32_t>* pos, std::vector<float>* score) {
  HEAVYKV_CUDA_RETURN(cudaStreamSynchronize(impl_->stream));
  const cuda::DeviceKvPool& p = impl_->pool;
  const KvTable& table = seq.Table(0);
  pos->resize(table.num_slots);
  score->resize(table.num_slots);
  for (int32_t s0 = 0; s0 < table.num_slots; s0 += p.block_size) {
    const int32_t n = std::min(p.block_size, table.num_slots - s0);
    const int64_t m = p.MetaOffset(table.pages[s0 / p.block_size], layer, kv_head, 0);
    HEAVYKV_CUDA_RETURN(cudaMemcpy(pos->data() + s0, p.pos + m, n * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost));
    HEAVYKV_CUDA_RETURN(cudaMemcpy(score->data() + s0, p.score + m, n * sizeof(float),
                                   cudaMemcpyDeviceToHost));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StepRunner>> MakeCudaModelRunner(const Model& model,
                                                                KvCache* cache,
                                                                const StepRunnerOptions& options) {
  absl::StatusOr<std::unique_ptr<CudaModelRunner>> r =
      CudaModelRunner::Create(model, cache, options);
  if (!r.ok()) return r.status();
  return std::unique_ptr<StepRunner>(*std::move(r));
}

}  // namespace heavykv

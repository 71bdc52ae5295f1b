#include "kernels/cuda/gemm.cuh"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

namespace heavykv::cuda {
namespace {

// The cuBLASLt entry points this file uses, resolved from the library loaded at run time.
struct Lt {
  decltype(&cublasLtCreate) Create = nullptr;
  decltype(&cublasLtDestroy) Destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
  decltype(&cublasLtMatmul) Matmul = nullptr;
  bool ok = false;
};

const Lt& LoadLt() {
  static Lt lt;
  static std::once_flag once;
  std::call_once(once, [] {
    void* so = nullptr;
    for (const char* name : {HEAVYKV_CUBLASLT_PATH, HEAVYKV_CUBLASLT_SONAME, "libcublasLt.so"}) {
      if ((so = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (so == nullptr) return;
    bool all = true;
    auto get = [&](auto& fn, const char* sym) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(so, sym));
      all = all && fn != nullptr;
    };
    get(lt.Create, "cublasLtCreate");
    get(lt.Destroy, "cublasLtDestroy");
    get(lt.MatmulDescCreate, "cublasLtMatmulDescCreate");
    get(lt.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    get(lt.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    get(lt.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    get(lt.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    get(lt.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    get(lt.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    get(lt.Matmul, "cublasLtMatmul");
    lt.ok = all;
  });
  return lt;
}

// Row-major y[m][n] = x[m][k] W[n][k]^T is, column-major, Y (n x m) = W^T' (op T on W stored
// k x n) * X (k x m): A = W with transa = T, B = x with transb = N.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
};

using Key = std::tuple<cublasLtHandle_t, int64_t, int64_t, int64_t, int64_t, bool, size_t>;

#define HEAVYKV_LT(expr)                                       \
  do {                                                         \
    cublasStatus_t s_ = (expr);                                \
    if (s_ != CUBLAS_STATUS_SUCCESS) return s_;                \
  } while (0)

constexpr int kTuneCandidates = 8;

// HEAVYKV_CUDA_GEMM_TUNE=1: time cuBLASLt's first kTuneCandidates heuristic algorithms once per
// shape instead of taking its first (read once per process).
bool TuneGemms() {
  static const bool tune = [] {
    const char* v = std::getenv("HEAVYKV_CUDA_GEMM_TUNE");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return tune;
}

// Times each candidate on `stream` (a warm-up, then 3 runs) and returns the fastest one's index.
// The runs write y = x W^T (beta 0) into the second half of the workspace, so that neither y nor
// an accumulated residual is touched; candidates get the first half as their workspace. Returns
// 0 (the heuristic's first) where the output does not fit or timing fails.
int FastestCandidate(cublasLtHandle_t lt, const Plan& p,
                     const cublasLtMatmulHeuristicResult_t* results, int found, const bf16* x,
                     const bf16* w, int64_t m, int64_t ldy, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream) {
  const size_t half = workspace_bytes / 2 / 256 * 256;
  if (found <= 1 || size_t(m) * size_t(ldy) * sizeof(float) > half) return 0;
  float* scratch = reinterpret_cast<float*>(static_cast<char*>(workspace) + half);
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const Lt& L = LoadLt();
  const float alpha = 1.0f, beta = 0.0f;
  int best = 0;
  float best_ms = 0.0f;
  for (int i = 0; i < found; ++i) {
    if (results[i].workspaceSize > half) continue;
    auto run = [&] {
      return L.Matmul(lt, p.desc, &alpha, w, p.a, x, p.b, &beta, scratch, p.c, scratch, p.c,
                      &results[i].algo, workspace, half, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;
    cudaEventRecord(start, stream);
    for (int r = 0; r < 3; ++r) run();
    cudaEventRecord(stop, stream);
    float ms = 0.0f;
    if (cudaEventSynchronize(stop) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    if (i == 0 || ms < best_ms) {
      best = i;
      best_ms = ms;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

cublasStatus_t MakePlan(cublasLtHandle_t lt, size_t workspace_bytes, int64_t m, int64_t n,
                        int64_t k, int64_t ldy, bool accumulate, const bf16* x, const bf16* w,
                        void* workspace, cudaStream_t stream, Plan* p) {
  const Lt& L = LoadLt();
  HEAVYKV_LT(L.MatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  HEAVYKV_LT(L.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  HEAVYKV_LT(L.MatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  HEAVYKV_LT(L.MatrixLayoutCreate(&p->a, CUDA_R_16BF, k, n, k));
  HEAVYKV_LT(L.MatrixLayoutCreate(&p->b, CUDA_R_16BF, k, m, k));
  HEAVYKV_LT(L.MatrixLayoutCreate(&p->c, CUDA_R_32F, n, m, ldy));
  cublasLtMatmulPreference_t pref = nullptr;
  HEAVYKV_LT(L.MatmulPreferenceCreate(&pref));
  cublasStatus_t s = L.MatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes));
  // Activations may start at any 16-byte boundary (rows of a larger buffer).
  const uint32_t align = 16;
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = L.MatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
    }
  }
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS) {
    s = L.MatmulAlgoGetHeuristic(lt, p->desc, p->a, p->b, p->c, p->c, pref,
                                 TuneGemms() ? kTuneCandidates : 1, results, &found);
  }
  L.MatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  const int best = TuneGemms() ? FastestCandidate(lt, *p, results, found, x, w, m, ldy, workspace,
                                                  workspace_bytes, stream)
                               : 0;
  p->algo = results[best].algo;
  p->ok = true;
  (void)accumulate;
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t CreateGemmHandle(cublasLtHandle_t* handle) {
  const Lt& L = LoadLt();
  if (!L.ok) return CUBLAS_STATUS_NOT_INITIALIZED;
  return L.Create(handle);
}

void DestroyGemmHandle(cublasLtHandle_t handle) {
  const Lt& L = LoadLt();
  if (L.ok && handle != nullptr) L.Destroy(handle);
}

cublasStatus_t GemmBf16(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes,
                        const bf16* x, const bf16* w, float* y, int64_t m, int64_t n, int64_t k,
                        int64_t ldy, bool accumulate, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return CUBLAS_STATUS_SUCCESS;
  if (!LoadLt().ok) return CUBLAS_STATUS_NOT_INITIALIZED;
  // Plans live as long as the thread (a handful of shapes per model and step size).
  thread_local std::map<Key, Plan> plans;
  Plan& p = plans[Key{lt, m, n, k, ldy, accumulate, workspace_bytes}];
  if (!p.ok) {
    HEAVYKV_LT(MakePlan(lt, workspace_bytes, m, n, k, ldy, accumulate, x, w, workspace, stream,
                        &p));
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  return LoadLt().Matmul(lt, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                        workspace, workspace_bytes, stream);
}

}  // namespace heavykv::cuda

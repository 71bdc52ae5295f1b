#include "kernels/cuda/gemm.cuh"

#include <dlfcn.h>

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

cublasStatus_t MakePlan(cublasLtHandle_t lt, size_t workspace_bytes, int64_t m, int64_t n,
                        int64_t k, int64_t ldy, bool accumulate, Plan* p) {
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
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS) {
    s = L.MatmulAlgoGetHeuristic(lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result,
                                       &found);
  }
  L.MatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (found == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  p->algo = result.algo;
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
  if (!p.ok) HEAVYKV_LT(MakePlan(lt, workspace_bytes, m, n, k, ldy, accumulate, &p));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  return LoadLt().Matmul(lt, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                        workspace, workspace_bytes, stream);
}

}  // namespace heavykv::cuda

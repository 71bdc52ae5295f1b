// The quantized-weight kernels (kernels/cuda/quant_gemv.cuh, quant_dequant.cuh; issue 32) against
// the CPU reference dequantizer (cpu::DequantizeRow) for each format the GPU keeps quantized:
// Q4_0, Q8_0, Q4_K, Q5_K, Q6_K. Two kinds of blocks: rows quantized from random values with
// llama.cpp's reference quantizers (what files hold), and raw random bytes with only the fp16
// scale fields set to small finite values (every bit pattern of quants, 6-bit scales/mins and
// Q6_K's signed scales). The GEMV is compared with a double-precision product of the dequantized
// weights and the bf16-rounded activations (fp32 accumulation: ~1e-6); the bf16 slab and the
// embedding rows must equal the dequantized values exactly (rounded to bf16 for the slab: the
// device decoding does the reference's fp32 operations, unfused, quant_decode.cuh).
// The GPU tests skip without a device; the argument checks run everywhere.
// AS OF THIS COMMIT THESE KERNELS HAVE NEVER RUN ON A GPU: the device tests are in
// scripts/gpu-check.sh for the next session that has one.
#include "kernels/cuda/quant_gemv.cuh"

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/quant_types.h"
#include "kernels/cuda/quant_dequant.cuh"
#include "tests/cuda/cuda_test_util.h"

namespace heavykv {
namespace {

using cpu::QuantType;
using testing::DeviceArray;
using testing::FromBf16;
using testing::NormalizedError;
using testing::RandomVector;
using testing::RoundBf16;
using testing::ToBf16;
using bf16 = __nv_bfloat16;

constexpr QuantType kGpuTypes[] = {QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kQ4_K,
                                   QuantType::kQ5_K, QuantType::kQ6_K};

// Byte offsets of a block's fp16 scale fields.
std::vector<int> HalfFields(QuantType t) {
  switch (t) {
    case QuantType::kQ4_K:
    case QuantType::kQ5_K:
      return {0, 2};  // d, dmin
    case QuantType::kQ6_K:
      return {208};
    default:
      return {0};
  }
}

// [n][row_bytes] blocks: quantized from uniform values, or random bytes with sane fp16 scales.
std::vector<uint8_t> MakeBlocks(QuantType t, int64_t n, int64_t k, uint32_t seed, bool raw) {
  const int64_t row_bytes = cpu::QuantRowBytes(t, k);
  std::vector<uint8_t> bytes(n * row_bytes);
  if (!raw) {
    const std::vector<float> w = RandomVector(n * k, seed);
    for (int64_t r = 0; r < n; ++r)
      cpu::QuantizeRow(t, w.data() + r * k, bytes.data() + r * row_bytes, k);
    return bytes;
  }
  std::mt19937 rng(seed);
  for (uint8_t& b : bytes) b = uint8_t(rng());
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  const int64_t block = cpu::QuantBlockBytes(t);
  for (int64_t off = 0; off < int64_t(bytes.size()); off += block) {
    for (int f : HalfFields(t)) {
      const uint16_t h = cpu::FloatToFp16(scale(rng));
      std::memcpy(bytes.data() + off + f, &h, 2);
    }
  }
  return bytes;
}

std::vector<float> Dequantized(QuantType t, const std::vector<uint8_t>& bytes, int64_t n,
                               int64_t k) {
  std::vector<float> w(n * k);
  const int64_t row_bytes = cpu::QuantRowBytes(t, k);
  for (int64_t r = 0; r < n; ++r)
    cpu::DequantizeRow(t, bytes.data() + r * row_bytes, w.data() + r * k, k);
  return w;
}

cuda::QuantMatrixView View(QuantType t, const uint8_t* data, int64_t n, int64_t k) {
  return {data, static_cast<cuda::QuantBlockType>(t), n, k, cpu::QuantRowBytes(t, k)};
}

TEST(CudaQuantGemvTest, MatchesTheReferenceDequantizer) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  // 67 rows: a last thread block with 3 of its 8 warps; k = 768: 3 K-quant super-blocks, 24
  // blocks of 32.
  const int64_t n = 67, k = 768, ldy = n + 5;
  for (QuantType t : kGpuTypes) {
    for (bool raw : {false, true}) {
      SCOPED_TRACE(absl::StrCat(cpu::QuantTypeName(t), raw ? " raw bytes" : " quantized"));
      const std::vector<uint8_t> bytes = MakeBlocks(t, n, k, 11, raw);
      const std::vector<float> w = Dequantized(t, bytes, n, k);
      DeviceArray<uint8_t> dw(bytes);
      for (int64_t m : {1, 3, 8}) {
        SCOPED_TRACE(absl::StrCat("m = ", m));
        std::vector<float> x = RandomVector(m * k, 7 + m);
        for (float& v : x) v = RoundBf16(v);
        DeviceArray<bf16> dx(ToBf16(x));
        const std::vector<float> y0 = RandomVector(m * ldy, 3);
        for (bool accumulate : {false, true}) {
          DeviceArray<float> dy(y0);
          HEAVYKV_CUDA_OK(
              cuda::QuantGemv(View(t, dw.get(), n, k), dx.get(), dy.get(), m, ldy, accumulate, 0));
          const std::vector<float> got = dy.Download();
          std::vector<float> want_rows, got_rows;
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < ldy; ++j) {
              if (j >= n) {  // columns past n are untouched
                EXPECT_EQ(got[i * ldy + j], y0[i * ldy + j]);
                continue;
              }
              double acc = accumulate ? y0[i * ldy + j] : 0.0;
              for (int64_t d = 0; d < k; ++d) acc += double(x[i * k + d]) * w[j * k + d];
              want_rows.push_back(float(acc));
              got_rows.push_back(got[i * ldy + j]);
            }
          }
          EXPECT_LT(NormalizedError(got_rows, want_rows), 1e-5) << "accumulate " << accumulate;
        }
      }
    }
  }
}

TEST(CudaQuantGemvTest, SlabsAndEmbeddingRowsMatchTheReferenceDequantizer) {
  HEAVYKV_SKIP_WITHOUT_GPU();
  const int64_t n = 67, k = 512;
  for (QuantType t : kGpuTypes) {
    for (bool raw : {false, true}) {
      SCOPED_TRACE(absl::StrCat(cpu::QuantTypeName(t), raw ? " raw bytes" : " quantized"));
      const std::vector<uint8_t> bytes = MakeBlocks(t, n, k, 29, raw);
      const std::vector<float> w = Dequantized(t, bytes, n, k);
      DeviceArray<uint8_t> dw(bytes);
      const cuda::QuantMatrixView v = View(t, dw.get(), n, k);
      // Rows [3, 43) as bf16: the CPU's values, rounded to nearest even.
      const int64_t row0 = 3, rows = 40;
      DeviceArray<bf16> slab(rows * k);
      HEAVYKV_CUDA_OK(cuda::DequantizeBf16(v, row0, rows, slab.get(), 0));
      std::vector<float> want(w.begin() + row0 * k, w.begin() + (row0 + rows) * k);
      for (float& x : want) x = RoundBf16(x);
      EXPECT_EQ(FromBf16(slab.Download()), want);
      // Embedding rows, repeated and out of order.
      const std::vector<int32_t> tokens = {5, 0, 66, 5};
      DeviceArray<int32_t> dt(tokens);
      DeviceArray<float> out(tokens.size() * k);
      HEAVYKV_CUDA_OK(cuda::QuantEmbedding(v, dt.get(), out.get(), int64_t(tokens.size()), 0));
      std::vector<float> rows_want;
      for (int32_t tok : tokens)
        rows_want.insert(rows_want.end(), w.begin() + tok * k, w.begin() + (tok + 1) * k);
      EXPECT_EQ(out.Download(), rows_want);
    }
  }
}

// Host-side argument checks: these return before any launch, so they run without a GPU.
TEST(CudaQuantGemvTest, BadArgumentsAreRefusedBeforeLaunch) {
  const int64_t k = 256;
  const cuda::QuantMatrixView v = View(QuantType::kQ4_K, nullptr, 4, k);
  EXPECT_EQ(cuda::QuantGemv(v, nullptr, nullptr, 0, 4, false, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::QuantGemv(v, nullptr, nullptr, cuda::kQuantGemvTile + 1, 4, false, 0),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::QuantGemv(v, nullptr, nullptr, 1, 3, false, 0),
            cudaErrorInvalidValue);  // ldy < n
  cuda::QuantMatrixView ragged = v;
  ragged.cols = 100;  // not whole blocks
  EXPECT_EQ(cuda::QuantGemv(ragged, nullptr, nullptr, 1, 4, false, 0), cudaErrorInvalidValue);
  cuda::QuantMatrixView q5_0 = v;
  q5_0.type = static_cast<cuda::QuantBlockType>(6);  // Q5_0: no kernel
  EXPECT_EQ(cuda::QuantGemv(q5_0, nullptr, nullptr, 1, 4, false, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::DequantizeBf16(v, 2, 3, nullptr, 0), cudaErrorInvalidValue);  // past the rows
  cuda::QuantMatrixView wrong_bytes = v;
  wrong_bytes.row_bytes = 145;
  EXPECT_EQ(cuda::QuantEmbedding(wrong_bytes, nullptr, nullptr, 1, 0), cudaErrorInvalidValue);
  // Nothing to do is success, also without a device.
  EXPECT_EQ(cuda::DequantizeBf16(v, 0, 0, nullptr, 0), cudaSuccess);
  EXPECT_EQ(cuda::QuantEmbedding(v, nullptr, nullptr, 0, 0), cudaSuccess);
}

}  // namespace
}  // namespace heavykv

// The GGUF block formats the CUDA backend keeps quantized (issue 32): Q4_0, Q8_0, Q4_K, Q5_K,
// Q6_K, as the file stores them (kernels/cpu/quant_types.h documents each layout), and the plain
// view the kernels take of a matrix in one of them. Host-safe: no device code (the decoding is in
// quant_decode.cuh, included only by the .cu files).
//
// Alignment: a block starts at row * row_bytes + b * block_bytes from a 256-byte aligned base.
// Q4_K (144 B) and Q5_K (176 B) blocks are then 16-byte aligned; Q4_0 (18 B), Q8_0 (34 B) and
// Q6_K (210 B) blocks only 2-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace heavykv::cuda {

// The ggml type ids (the `type` field of a GGUF tensor) of the formats with a CUDA kernel.
enum class QuantBlockType : uint32_t { kQ4_0 = 2, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

template <QuantBlockType T>
struct QuantBlockTraits;
template <>
struct QuantBlockTraits<QuantBlockType::kQ4_0> {
  static constexpr int kElems = 32, kBytes = 18;
};
template <>
struct QuantBlockTraits<QuantBlockType::kQ8_0> {
  static constexpr int kElems = 32, kBytes = 34;
};
template <>
struct QuantBlockTraits<QuantBlockType::kQ4_K> {
  static constexpr int kElems = 256, kBytes = 144;
};
template <>
struct QuantBlockTraits<QuantBlockType::kQ5_K> {
  static constexpr int kElems = 256, kBytes = 176;
};
template <>
struct QuantBlockTraits<QuantBlockType::kQ6_K> {
  static constexpr int kElems = 256, kBytes = 210;
};

// A matrix W[rows][cols] in one of these formats on the device: `rows` rows of `row_bytes`
// (= cols / elems * block bytes) each, rows back to back from `data` (256-byte aligned), as the
// GGUF file stores the tensor.
struct QuantMatrixView {
  const uint8_t* data = nullptr;
  QuantBlockType type = QuantBlockType::kQ4_0;
  int64_t rows = 0, cols = 0, row_bytes = 0;
};

// Elements and bytes per block (host and device), 0 for an id that is not one of the five.
__host__ __device__ constexpr int QuantBlockElemsOf(QuantBlockType t) {
  return t == QuantBlockType::kQ4_0 || t == QuantBlockType::kQ8_0 ? 32
         : t == QuantBlockType::kQ4_K || t == QuantBlockType::kQ5_K || t == QuantBlockType::kQ6_K
             ? 256
             : 0;
}
__host__ __device__ constexpr int QuantBlockBytesOf(QuantBlockType t) {
  return t == QuantBlockType::kQ4_0   ? 18
         : t == QuantBlockType::kQ8_0 ? 34
         : t == QuantBlockType::kQ4_K ? 144
         : t == QuantBlockType::kQ5_K ? 176
         : t == QuantBlockType::kQ6_K ? 210
                                      : 0;
}

// The launchers' one switch over the five formats: calls f with
// std::integral_constant<QuantBlockType, T> for t's format T and returns its result, or returns
// `otherwise` when t is not one of them.
template <class R, class F>
R WithBlockType(QuantBlockType t, R otherwise, F&& f) {
  using T = QuantBlockType;
  switch (t) {
    case T::kQ4_0: return f(std::integral_constant<T, T::kQ4_0>{});
    case T::kQ8_0: return f(std::integral_constant<T, T::kQ8_0>{});
    case T::kQ4_K: return f(std::integral_constant<T, T::kQ4_K>{});
    case T::kQ5_K: return f(std::integral_constant<T, T::kQ5_K>{});
    case T::kQ6_K: return f(std::integral_constant<T, T::kQ6_K>{});
  }
  return otherwise;
}

}  // namespace heavykv::cuda

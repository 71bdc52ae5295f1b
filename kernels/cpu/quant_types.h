// The weight formats of GGUF files (ggml's block layouts) that the CPU kernels read directly:
// QuantType with each type's block geometry, fp16 conversions, and QuantizeRow / DequantizeRow
// for one row. A row of k elements is k / block_elems consecutive blocks, exactly as the file
// stores it, so a tensor's bytes are used unchanged (QuantMatrix, quant_matrix.h).
//
//   type   block  bytes  layout of one block (little-endian)
//   F32      1      4    float
//   F16      1      2    IEEE half
//   BF16     1      2    upper half of an fp32
//   Q8_0    32     34    fp16 d; int8 q[32]                       x = d * q
//   Q4_0    32     18    fp16 d; u8 qs[16]: low nibble -> 0..15, high -> 16..31; x = d * (q - 8)
//   Q5_0    32     22    fp16 d; u32 qh (bit j = 5th bit of x[j]); qs[16] as Q4_0; x = d * (q - 16)
//   Q4_K   256    144    fp16 d, dmin; u8 scales[12] (8 x 6-bit scale + 6-bit min); qs[128]
//                        x = d * sc[j] * q - dmin * m[j], sub-block j of 32, q 4 bits
//   Q5_K   256    176    as Q4_K, then qh[32] (the 5th bits), then qs[128]
//   Q6_K   256    210    ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], fp16 d
//                        x = d * scales[j] * (q - 32), sub-block j of 16, q 6 bits
// The K-quant bit placement is documented beside the code (quant_kquants.cc).
#pragma once

#include <cstdint>
#include <cstring>

#include "absl/status/statusor.h"
#include "kernels/bf16.h"
#include "kernels/cpu/ggml_types.h"

namespace heavykv::cpu {

// ggml's tensor types (their ids are the `type` field of a GGUF tensor info: ggml_types.h holds
// the one table); the CPU kernels take the nine of kAllQuantTypes, and every function below
// takes only those (QuantTypeFromGgmlId turns an id into one or refuses it).
using QuantType = GgmlType;

// Every type the kernels take, for tests and benchmarks that cover them all.
inline constexpr QuantType kAllQuantTypes[] = {
    QuantType::kF32,  QuantType::kF16,  QuantType::kBF16, QuantType::kQ8_0, QuantType::kQ4_0,
    QuantType::kQ5_0, QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K};

// ggml's name: "f32", "q4_K", ...
inline const char* QuantTypeName(QuantType type) { return GgmlTypeInfoOf(type).ggml_name; }
// Elements per block (1, 32 or 256) and bytes per block.
inline int64_t QuantBlockElems(QuantType type) { return GgmlTypeInfoOf(type).block_size; }
inline int64_t QuantBlockBytes(QuantType type) { return GgmlTypeInfoOf(type).block_bytes; }
// Bytes of a row of k elements; k must be a multiple of QuantBlockElems(type).
inline int64_t QuantRowBytes(QuantType type, int64_t k) {
  return k / QuantBlockElems(type) * QuantBlockBytes(type);
}
// The type of ggml id `id`, or InvalidArgument naming the id when heavykv has no kernel for it.
absl::StatusOr<QuantType> QuantTypeFromGgmlId(uint32_t id);

// dst[k] = the values of the k elements at src. k must be a multiple of the block (aborts
// otherwise: callers validate shapes when a matrix is created, QuantMatrix::FromRows).
void DequantizeRow(QuantType type, const void* src, float* dst, int64_t k);
// Writes QuantRowBytes(type, k) bytes at dst encoding src[k], with llama.cpp's reference
// quantizer's arithmetic (no importance matrix), so files written here match llama-quantize's.
void QuantizeRow(QuantType type, const float* src, void* dst, int64_t k);

// IEEE fp16 <-> fp32 (kernels/bf16.h).
using heavykv::Fp16ToFloat;
using heavykv::FloatToFp16;

}  // namespace heavykv::cpu

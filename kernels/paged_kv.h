// PagedKvHead: the plain page-table view through which kernels read and write the K/V slots of
// one (sequence, layer, kv head). Kernels never see the allocator; the engine builds this view
// from the KvCache (memory/), which owns the storage.
//
// Slot s of the view lives on page pages[s / block_size] at row s % block_size:
//   K row : k   + pages[p] * page_stride      + r * head_dim   [head_dim] elements
//   V row : v   + pages[p] * page_stride      + r * head_dim   [head_dim] elements
// The elements are fp32 (k, v) or bf16 (k16, v16: the upper half of an fp32, rounded to
// nearest even, as vLLM's and llama.cpp's 16-bit caches), or quantized (kq, vq: int8 or int4
// rows of kernels/kv_quant.h); exactly one of the three pairs is set. Quantized rows are
// addressed in bytes, their data and scales apart:
//   K data : kq  + pages[p] * page_stride + r * row_bytes     [row_bytes]
//   K scale: ksc + pages[p] * page_stride + r * scale_bytes   [scale_bytes] (V: vq, vsc)
//   pos   : pos + pages[p] * meta_page_stride + r              position of the token held
//   score : score + pages[p] * meta_page_stride + r            the policy's channel (slot_channel.h)
// Keys are stored after RoPE at their original positions.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/bf16.h"
#include "kernels/kv_quant.h"

namespace heavykv {

// Starts loading the cache line at p (prefetcht0). An asm statement, not __builtin_prefetch:
// GCC 12 deletes a loop whose body is only __builtin_prefetch calls when its trip count is
// computed (as in PrefetchMeta), silently leaving no prefetch at all.
inline void PrefetchLine(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p);
#endif
}

struct PagedKvHead {
  const int32_t* pages = nullptr;  // [ceil(num_slots / block_size)] page ids
  int32_t num_slots = 0;
  int32_t block_size = 16;
  int32_t head_dim = 0;
  float* k = nullptr;  // fp32 storage
  float* v = nullptr;
  uint16_t* k16 = nullptr;  // bf16 storage
  uint16_t* v16 = nullptr;
  KvQuant quant = KvQuant::kNone;  // kq/vq set: their format
  uint8_t* kq = nullptr;           // quantized storage: row data
  uint8_t* vq = nullptr;
  uint8_t* ksc = nullptr;  // and the rows' scales
  uint8_t* vsc = nullptr;
  int32_t row_bytes = 0;    // KvQuantDataBytes
  int32_t scale_bytes = 0;  // KvQuantScaleBytes
  // Elements (fp32, bf16) or bytes (quantized) between the same row of two consecutive page ids.
  int64_t page_stride = 0;
  int32_t* pos = nullptr;
  float* score = nullptr;
  int64_t meta_page_stride = 0;  // entries between two consecutive page ids in pos/score

  bool bf16() const { return k16 != nullptr; }
  bool quantized() const { return kq != nullptr; }
  // Elements from the K (or V) base to slot s's row.
  int64_t RowOffset(int32_t s) const {
    return pages[s / block_size] * page_stride + int64_t(s % block_size) * head_dim;
  }
  float* KRow(int32_t s) const { return k + RowOffset(s); }
  float* VRow(int32_t s) const { return v + RowOffset(s); }
  uint16_t* KRow16(int32_t s) const { return k16 + RowOffset(s); }
  uint16_t* VRow16(int32_t s) const { return v16 + RowOffset(s); }
  // Bytes from the quantized base to slot s's row data (scale: QScaleOffset).
  int64_t QRowOffset(int32_t s) const {
    return pages[s / block_size] * page_stride + int64_t(s % block_size) * row_bytes;
  }
  int64_t QScaleOffset(int32_t s) const {
    return pages[s / block_size] * page_stride + int64_t(s % block_size) * scale_bytes;
  }
  // Writes slot s's K and V rows from fp32, in the storage's element type.
  void StoreRows(int32_t s, const float* k_row, const float* v_row) const {
    StoreRow(true, s, k_row);
    StoreRow(false, s, v_row);
  }
  // Writes slot s's K row only (the re-rotation of pinned keys).
  void StoreK(int32_t s, const float* k_row) const { StoreRow(true, s, k_row); }
  // Writes slot s's K (is_k) or V row from fp32: copied, rounded to bf16, or quantized.
  void StoreRow(bool is_k, int32_t s, const float* row) const {
    if (quantized()) {
      QuantizeRow(row, (is_k ? kq : vq) + QRowOffset(s), (is_k ? ksc : vsc) + QScaleOffset(s));
    } else if (bf16()) {
      uint16_t* dst = is_k ? KRow16(s) : VRow16(s);
      for (int32_t d = 0; d < head_dim; ++d) dst[d] = FloatToBf16(row[d]);
    } else {
      std::memcpy(is_k ? KRow(s) : VRow(s), row, sizeof(float) * head_dim);
    }
  }
  // Element d of slot s's K (V) row as fp32, whatever the storage.
  float KAt(int32_t s, int32_t d) const {
    if (quantized()) return DequantizedElem(kq + QRowOffset(s), ksc + QScaleOffset(s), d);
    return bf16() ? Bf16ToFloat(KRow16(s)[d]) : KRow(s)[d];
  }
  float VAt(int32_t s, int32_t d) const {
    if (quantized()) return DequantizedElem(vq + QRowOffset(s), vsc + QScaleOffset(s), d);
    return bf16() ? Bf16ToFloat(VRow16(s)[d]) : VRow(s)[d];
  }
  // Whether quantized rows are stored rotated (KvRotates): attention then runs on H q and
  // rotates its output back (PagedAttention does both).
  bool rotated() const { return quantized() && KvRotates(quant, head_dim); }
  // Quantizes x[head_dim] into one row (rotated first where rotated()).
  void QuantizeRow(const float* x, uint8_t* data, uint8_t* scale) const {
    if (!rotated()) {
      QuantizeKvRow(quant, x, head_dim, data, scale);
      return;
    }
    thread_local float buf[1024];
    std::memcpy(buf, x, sizeof(float) * head_dim);
    HadamardRotate(buf, head_dim);
    QuantizeKvRow(quant, buf, head_dim, data, scale);
  }
  // Element d of a quantized row in the tokens' own basis (a whole row is dequantized and
  // rotated back where rotated(): for tests and the re-rotation of pinned keys, not kernels).
  float DequantizedElem(const uint8_t* data, const uint8_t* scale, int32_t d) const {
    if (!rotated()) return DequantKvElem(quant, data, scale, head_dim, d);
    thread_local float buf[1024];
    DequantizeKvRow(quant, data, scale, head_dim, buf);
    HadamardRotate(buf, head_dim);
    return buf[d];
  }
  // out[head_dim] = slot s's K (is_k) or V row as fp32 in the tokens' own basis, whatever the
  // storage.
  void LoadRow(bool is_k, int32_t s, float* out) const {
    if (quantized()) {
      DequantizeKvRow(quant, (is_k ? kq : vq) + QRowOffset(s), (is_k ? ksc : vsc) + QScaleOffset(s),
                      head_dim, out);
      if (rotated()) HadamardRotate(out, head_dim);
      return;
    }
    for (int32_t d = 0; d < head_dim; ++d) out[d] = is_k ? KAt(s, d) : VAt(s, d);
  }
  void LoadK(int32_t s, float* out) const { LoadRow(true, s, out); }
  // Copies slot `from`'s K and V rows (and their scales) over slot `to`'s.
  void MoveRows(int32_t to, int32_t from) const {
    if (quantized()) {
      std::memcpy(kq + QRowOffset(to), kq + QRowOffset(from), row_bytes);
      std::memcpy(vq + QRowOffset(to), vq + QRowOffset(from), row_bytes);
      std::memcpy(ksc + QScaleOffset(to), ksc + QScaleOffset(from), scale_bytes);
      std::memcpy(vsc + QScaleOffset(to), vsc + QScaleOffset(from), scale_bytes);
    } else if (bf16()) {
      std::memcpy(KRow16(to), KRow16(from), sizeof(uint16_t) * head_dim);
      std::memcpy(VRow16(to), VRow16(from), sizeof(uint16_t) * head_dim);
    } else {
      std::memcpy(KRow(to), KRow(from), sizeof(float) * head_dim);
      std::memcpy(VRow(to), VRow(from), sizeof(float) * head_dim);
    }
  }
  int32_t& Pos(int32_t s) const {
    return pos[pages[s / block_size] * meta_page_stride + s % block_size];
  }
  float& Score(int32_t s) const {
    return score[pages[s / block_size] * meta_page_stride + s % block_size];
  }

  // Starts loading the pos and/or score entries of every page into cache. They
  // are one scattered cache line per page, which the hardware prefetcher never guesses; issued
  // before attention, their misses overlap its K/V stream instead of stalling the score update
  // and the eviction that read them afterwards.
  void PrefetchMeta(bool positions, bool scores) const {
    const int32_t num_pages = (num_slots + block_size - 1) / block_size;
    for (int32_t p = 0; p < num_pages; ++p) {
      const int64_t meta = int64_t(pages[p]) * meta_page_stride;
      if (positions) PrefetchLine(pos + meta);
      if (scores) PrefetchLine(score + meta);
    }
  }
};

}  // namespace heavykv

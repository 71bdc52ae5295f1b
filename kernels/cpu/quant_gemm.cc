#include "kernels/cpu/quant_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/aligned_vector.h"
#include "kernels/cpu/packed_gemm_panels.h"
#include "kernels/cpu/packed_matrix.h"
#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/quant_gemm_paths.h"

namespace heavykv::cpu {
namespace {

constexpr int kGroupRows = 8;  // rows dequantized together, then transposed into the panel

// Per-thread scratch, grown on demand and kept for the thread's life (the OpenMP pool's threads
// persist), so a call never allocates, nor faults in fresh pages, once warm.
template <typename T>
T* Scratch(AlignedVector<T>& buf, int64_t elems) {
  if (static_cast<int64_t>(buf.size()) < elems) buf.resize(elems);
  return buf.data();
}

void Dequantize(Isa isa, const QuantMatrix& w, int64_t r, float* out) {
  if (isa == Isa::kPortable) {
    w.DequantizeRowTo(r, out);
  } else {
    internal::DequantizeRowAvx2(w.type(), w.row(r), out, w.cols());
  }
}

void DotRows(Isa isa, const float* x, int64_t m, int64_t k, const float* wrow, float* out) {
  if (isa == Isa::kPortable) {
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) acc += x[i * k + kk] * wrow[kk];
      out[i] = acc;
    }
  } else {
    internal::DotRowsAvx2(x, m, k, wrow, out);
  }
}

// Rows [r0, r0 + count) of W against the m (<= kQuantRowPathMaxM) rows of x.
void RowPath(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
             bool accumulate, int64_t r0, int64_t count) {
  thread_local AlignedVector<float> row_buf;
  const int64_t k = w.cols();
  float* row = Scratch(row_buf, k);
  float dots[kQuantRowPathMaxM];
  for (int64_t r = r0; r < r0 + count; ++r) {
    Dequantize(isa, w, r, row);
    DotRows(isa, x, m, k, row, dots);
    for (int64_t i = 0; i < m; ++i)
      y[i * ldy + r] = accumulate ? y[i * ldy + r] + dots[i] : dots[i];
  }
}

// Panel p of W (rows p * 48 ..), dequantized into PackedMatrix's fp32 panel layout, against all of
// x.
void PanelPath(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
               bool accumulate, int64_t p) {
  thread_local AlignedVector<float> rows_buf, panel_buf;
  const int64_t n = w.rows(), k = w.cols();
  float* rows = Scratch(rows_buf, kGroupRows * k);    // [8][k]
  float* panel = Scratch(panel_buf, k * kPanelRows);  // [k][48]
  const int ncols = static_cast<int>(std::min(kPanelRows, n - p * kPanelRows));
  for (int j0 = 0; j0 < kPanelRows; j0 += kGroupRows) {
    for (int j = j0; j < j0 + kGroupRows; ++j) {
      float* dst = rows + (j - j0) * k;
      // Rows past n are zeros: the kernel multiplies them but never stores their outputs.
      if (j < ncols) {
        Dequantize(isa, w, p * kPanelRows + j, dst);
      } else {
        std::memset(dst, 0, k * sizeof(float));
      }
    }
    if (isa == Isa::kPortable) {
      for (int j = 0; j < kGroupRows; ++j) {
        for (int64_t kk = 0; kk < k; ++kk) panel[kk * kPanelRows + j0 + j] = rows[j * k + kk];
      }
    } else {
      internal::TransposeRows8Avx2(rows, k, panel + j0);
    }
  }
  internal::PanelFp32(isa, x, panel, nullptr, k * kPanelRows, y + p * kPanelRows, m, k, ldy,
                      accumulate, ncols);
}

// Up to this m, the 512-bit fused decoders (the 256-bit ones take m = 1 only). Measured at m = 8
// (both activation groups of 4 decoding the rows): faster at k = 2048 (q4_K 0.38 against 0.47
// ms), slower at k = 8192 (2.8 against 1.8 ms), where the rows' 4 activation rows no longer share
// L1 with the blocks.
constexpr int64_t kInt8FusedMaxM = 4;

// The int8 path's kernel for `isa`: AVX2 takes AVX-VNNI's 256-bit dpbusd where the CPU has it;
// AVX-512 needs AVX-512BW as well (every AVX-512 server CPU has it) and takes dpbusd where the
// CPU has AVX512-VNNI.
struct Int8Kernel {
  void (*dot)(const internal::DotTile&);
  void (*permute)(uint8_t*, int64_t);              // the order `dot` reads levels in; null: natural
  bool (*fused)(int, const internal::FusedRows&);  // rows straight from blocks; null: none
  int64_t fused_max_m;                             // the largest batch `fused` takes
  // Unpacks straight into `dot`'s order where it can (else false); null: none.
  bool (*decode)(int, const uint8_t*, int64_t, const internal::UnpackedSlice&);
};
Int8Kernel DotKernel(Isa isa) {
  static const bool bw = __builtin_cpu_supports("avx512bw"), vnni = bw && internal::HasAvx512Vnni();
  static const bool avx_vnni = IsaSupported(Isa::kAvx2) && internal::HasAvxVnni();
  const Int8Kernel avx2 = {avx_vnni ? internal::DotTileAvxVnni : internal::DotTileAvx2,
                           internal::PermuteLevelsAvx2,
                           avx_vnni ? internal::FusedRowsAvxVnni : internal::FusedRowsAvx2, 1,
                           nullptr};
  switch (isa) {
    case Isa::kPortable: return {internal::DotTilePortable, nullptr, nullptr, 0, nullptr};
    case Isa::kAvx2: return avx2;
    case Isa::kAvx512:
      if (!bw) return avx2;
      return {vnni ? internal::DotTileAvx512Vnni : internal::DotTileAvx512,
              internal::PermuteLevelsAvx512,
              vnni ? internal::FusedRowsAvx512Vnni : internal::FusedRowsAvx512, kInt8FusedMaxM,
              internal::DecodeSliceAvx512};
  }
  return {internal::DotTilePortable, nullptr, nullptr, 0, nullptr};
}

constexpr int kInt8BlockRows = 16;  // weight rows unpacked per slice (4 tiles of kDotTileRows)
constexpr int kInt8BlockActs = 16;  // activation rows per pass over those rows' slice
constexpr int64_t kInt8WholeRowMaxM = 4;  // up to this m, slices are whole rows
constexpr int64_t kInt8SerialQuantizeMax = 1 << 16;  // activation inputs quantized unsplit
// The fused path prefetches the next block's rows only when they are shorter than this: a long
// row is one sequential stream that the hardware prefetcher follows on its own, and the extra
// prefetches then only compete with it. Measured on Zen 4, batch-1 decode of llama3.2-1b, three
// alternating runs: Q8_0 20.6-24.5 tokens/s prefetching every row, 23.6-27.5 with this limit
// (the MLP's down projection has 8704-byte rows); Q4_K_M 33.4-41.8 and 37.4-42.7; prefetching
// no row lost Q4_K_M 2-5 tokens/s (its 1-2 KiB rows of k = 2048 still gain from it).
constexpr int64_t kInt8PrefetchMaxRowBytes = 4096;

// Rows [r0, r0 + nr) (nr <= kInt8BlockRows) of W against all of `a`'s rows: each slice of kDotSlice
// inputs is unpacked once and dotted with every activation row, kInt8BlockActs rows at a time so
// that both sides' slices stay in L1 / L2 while they are reused.
void Int8Block(const Int8Kernel& kernel, bool avx2, const internal::QuantActs& a,
               const QuantMatrix& w, float* y, int64_t ldy, bool accumulate, int64_t r0, int nr) {
  thread_local AlignedVector<uint8_t> lv_buf;
  thread_local AlignedVector<float> f_buf, acc_buf;
  const int64_t m = a.m, k = w.cols();
  // Small batches take whole rows: the weights then stream in address order, one row after the
  // other, which the hardware prefetcher follows; the unpacked rows (3 bytes an input) stay in L2.
  const int64_t slice = m <= kInt8WholeRowMaxM ? a.kp : internal::kDotSlice;
  uint8_t* lv = Scratch(lv_buf, kInt8BlockRows * slice);
  float* fl = Scratch(f_buf, 2 * kInt8BlockRows * (slice / 16));
  float* acc = Scratch(acc_buf, 2 * kInt8BlockRows * m);  // [2][nr][m]: sums, this slice's part
  float* part = acc + kInt8BlockRows * m;
  internal::UnpackedSlice slices[kInt8BlockRows];
  for (int r = 0; r < nr; ++r) {
    slices[r] = {lv + r * slice, fl + r * (slice / 16), fl + (kInt8BlockRows + r) * (slice / 16)};
  }
  // Small batches of the types with a fused decoder skip the unpacked copy. The decoder says
  // whether it has the type: only the first row can be refused, and then nothing was written.
  bool fused = kernel.fused != nullptr && m <= kernel.fused_max_m && k % 256 == 0;
  if (fused) {
    for (int r = 0; r < nr; ++r) {
      const uint8_t* row = w.row(r0 + r);
      internal::FusedRows f{
          &row,        1, k / 256, a.qs, a.scale, a.sum, a.kp, a.kp / 16, static_cast<int>(m),
          acc + r * m, m};
      if (!kernel.fused(static_cast<int>(w.type()), f)) {
        fused = false;
        break;
      }
      if (r0 + kInt8BlockRows + r < w.rows()) {
        const uint8_t* next = w.row(r0 + kInt8BlockRows + r);
        if (w.row_bytes() < kInt8PrefetchMaxRowBytes) {
          for (int64_t b = 0; b < w.row_bytes(); b += 64) __builtin_prefetch(next + b, 0, 2);
        }
      }
    }
  }
  if (!fused) {
    for (int64_t k0 = 0; k0 < k; k0 += slice) {
      const int64_t len = std::min(slice, k - k0);
      const int64_t len_p = (len + internal::kDotPad - 1) / internal::kDotPad * internal::kDotPad;
      const int64_t block_bytes = QuantBlockBytes(w.type()), block = QuantBlockElems(w.type());
      for (int r = 0; r < nr; ++r) {
        const bool decoded =
            kernel.decode != nullptr && len % 256 == 0 &&
            kernel.decode(static_cast<int>(w.type()), w.row(r0 + r) + k0 / block * block_bytes,
                          len / 256, slices[r]);
        if (!decoded) {
          internal::UnpackSlice(w.type(), w.row(r0 + r), k0, len, slices[r], avx2);
          if (kernel.permute != nullptr) kernel.permute(slices[r].lv, len_p);
        }
        // The same slice of the row one block on (this thread's next rows, schedule(static)) into
        // L2, so its memory latency overlaps this block's dot products instead of stalling the
        // unpacker.
        if (r0 + kInt8BlockRows + r < w.rows()) {
          const uint8_t* next = w.row(r0 + kInt8BlockRows + r) + k0 / block * block_bytes;
          for (int64_t b = 0; b < len / block * block_bytes; b += 64)
            __builtin_prefetch(next + b, 0, 2);
        }
      }
      for (int64_t c0 = 0; c0 < m; c0 += kInt8BlockActs) {
        for (int t0 = 0; t0 < nr; t0 += internal::kDotTileRows) {
          internal::DotTile t;
          t.w = slices + t0;
          t.nr = std::min(internal::kDotTileRows, nr - t0);
          t.qs = a.qs + c0 * a.kp + k0;
          t.scale = a.scale + c0 * (a.kp / 16) + k0 / 16;
          t.sum = a.sum + c0 * (a.kp / 16) + k0 / 16;
          t.qs_stride = a.kp;
          t.f_stride = a.kp / 16;
          t.nc = static_cast<int>(std::min<int64_t>(kInt8BlockActs, m - c0));
          t.len = len_p;
          t.signed_levels = w.type() == QuantType::kQ8_0;
          t.out = (k0 == 0 ? acc : part) + t0 * m + c0;
          t.ldo = m;
          kernel.dot(t);
        }
      }
      if (k0 > 0) {
        for (int64_t j = 0; j < nr * m; ++j) acc[j] += part[j];
      }
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    float* yi = y + i * ldy + r0;
    for (int r = 0; r < nr; ++r) yi[r] = accumulate ? yi[r] + acc[r * m + i] : acc[r * m + i];
  }
}

// How MatmulInt8 shares its rows: one thread, its own parallel region, or the enclosing region's
// team (MatmulQuantTeam).
enum class Int8Threads { kSerial, kParallel, kTeam };

// Team mode hands out blocks of rows guided: large chunks first (each a long sequential stream of
// weights), shrinking to this many blocks (64 rows, llama.cpp's chunk for a batch of one) at the
// end, so that a thread that lost its core for a moment leaves the rest to the others.
constexpr int64_t kTeamChunkBlocks = 4;

void MatmulInt8(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
                bool accumulate, Int8Threads threads) {
  thread_local AlignedVector<int8_t> qs_buf;
  thread_local AlignedVector<float> f_buf;
  const int64_t n = w.rows(), k = w.cols();
  internal::QuantActs a;
  a.m = m;
  a.k = k;
  a.kp = (k + internal::kDotPad - 1) / internal::kDotPad * internal::kDotPad;
  a.qs = Scratch(qs_buf, m * a.kp);
  a.block = internal::Int8ActBlock(w.type());
  a.scale = Scratch(f_buf, 2 * m * (a.kp / 16));
  a.sum = a.scale + m * (a.kp / 16);
  const Int8Kernel kernel = DotKernel(isa);
  const int64_t blocks = (n + kInt8BlockRows - 1) / kInt8BlockRows;
  auto quantize_row = [&](int64_t i) {
    internal::QuantizeActRows(x, i, i + 1, a);
    if (kernel.permute != nullptr)
      kernel.permute(reinterpret_cast<uint8_t*>(a.qs + i * a.kp), a.kp);
  };
  auto block = [&](int64_t b) {
    const int64_t r0 = b * kInt8BlockRows;
    Int8Block(kernel, isa != Isa::kPortable, a, w, y, ldy, accumulate, r0,
              static_cast<int>(std::min<int64_t>(kInt8BlockRows, n - r0)));
  };
  // Decode-sized batches are quantized by the calling thread (in a team, by every thread into
  // its own buffer) before the dot products: a barrier between quantizing and the dot products
  // would cost more than the few microseconds of work it spreads (and on a busy machine it waits
  // for a descheduled thread's time slice).
  const bool parallel = threads == Int8Threads::kParallel;
  const bool quantize_first = !parallel || m * k <= kInt8SerialQuantizeMax;
  if (quantize_first) {
    for (int64_t i = 0; i < m; ++i) quantize_row(i);
  }
  if (threads == Int8Threads::kTeam) {
    // Orphaned: binds to the caller's parallel region. nowait: the caller's barrier ends it.
#pragma omp for schedule(guided, kTeamChunkBlocks) nowait
    for (int64_t b = 0; b < blocks; ++b) block(b);
    return;
  }
#pragma omp parallel if (parallel)
  {
    if (!quantize_first) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < m; ++i) quantize_row(i);
    }
    // schedule(static): contiguous ranges of rows keep each thread's weight stream sequential.
    // nowait: the region's end is the one barrier.
#pragma omp for schedule(static) nowait
    for (int64_t b = 0; b < blocks; ++b) block(b);
  }
}

}  // namespace

bool QuantUsesInt8(QuantType type, int64_t m) {
  (void)m;  // measured: no m where the fp32 path beats int8 (quant_gemm.h)
  return internal::HasInt8Dot(type);
}

void MatmulQuantWith(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m,
                     int64_t ldy, bool accumulate, QuantPath path) {
  const int64_t n = w.rows(), k = w.cols();
  if (m <= 0 || n == 0) return;
  const bool parallel = !omp_in_parallel() && m * n * k >= (int64_t(1) << 21);
  const bool int8 = path == QuantPath::kInt8   ? internal::HasInt8Dot(w.type())
                    : path == QuantPath::kAuto ? QuantUsesInt8(w.type(), m)
                                               : false;
  if (int8) {
    MatmulInt8(isa, x, w, y, m, ldy, accumulate,
               parallel ? Int8Threads::kParallel : Int8Threads::kSerial);
    return;
  }
  const int64_t panels = (n + kPanelRows - 1) / kPanelRows;
  // schedule(static): contiguous ranges of rows keep each thread's weight stream sequential.
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t p = 0; p < panels; ++p) {
    if (m <= kQuantRowPathMaxM) {
      const int64_t r0 = p * kPanelRows;
      RowPath(isa, x, w, y, m, ldy, accumulate, r0, std::min(kPanelRows, n - r0));
    } else {
      PanelPath(isa, x, w, y, m, ldy, accumulate, p);
    }
  }
}

void MatmulQuant(const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
                 bool accumulate) {
  MatmulQuantWith(BestIsa(), x, w, y, m, ldy, accumulate);
}

void MatmulQuantTeam(const float* x, const QuantMatrix& w, float* y, int64_t m, int64_t ldy,
                     bool accumulate) {
  MatmulQuantTeamWith(BestIsa(), x, w, y, m, ldy, accumulate);
}

void MatmulQuantTeamWith(Isa isa, const float* x, const QuantMatrix& w, float* y, int64_t m,
                         int64_t ldy, bool accumulate) {
  if (m <= 0 || w.rows() == 0) return;
  MatmulInt8(isa, x, w, y, m, ldy, accumulate, Int8Threads::kTeam);
}

void DequantizeRowWith(Isa isa, const QuantMatrix& w, int64_t r, float* out) {
  Dequantize(isa, w, r, out);
}

}  // namespace heavykv::cpu

// Elementwise and row-wise kernels of the Llama forward pass (CPU), written to match
// llama2.c run.c's arithmetic so that greedy decoding reproduces it.
#pragma once

#include <cstdint>

namespace heavykv::cpu {

// out[t] = w * x[t] / sqrt(mean(x[t]^2) + eps) for each of `rows` rows of `dim`.
void RmsNorm(const float* x, const float* w, float* out, int64_t rows, int64_t dim,
             float eps = 1e-5f);

// Rotates, in place, the first `rot_dim` entries of row t of x [rows][row_stride] (pairs (2i,
// 2i+1), frequency theta^(-(2i mod head_dim)/head_dim)) by angle pos[t] * frequency.
// Requires head_dim <= 1024 (checked when a model is loaded).
void Rope(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim, int64_t head_dim,
          const int32_t* pos, float theta = 10000.0f);

// Rope of a model that is not llama2.c's: `neox` pairs entry i of a head with i + head_dim/2
// (Qwen, GPT-NeoX) instead of 2i with 2i+1; `freq_factors` (head_dim/2 floats, Llama 3.1's
// rope_freqs.weight, or null) divides pair j's frequency theta^(-2j/head_dim). With neox false
// and no factors it is Rope() above, bit for bit.
struct RopeParams {
  int64_t head_dim = 0;
  float theta = 10000.0f;
  bool neox = false;
  const float* freq_factors = nullptr;
};
void Rope(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim, const int32_t* pos,
          const RopeParams& p);
// Rope in two halves, for a step that rotates the same positions in every layer: RopeAngles
// writes each row's angles once (cos_sin [rows][head_dim]: head_dim / 2 cosines, then as many
// sines), RopeWithAngles rotates with them; together they are Rope, bit for bit.
void RopeAngles(const int32_t* pos, int64_t rows, const RopeParams& p, float* cos_sin);
void RopeWithAngles(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim,
                    const float* cos_sin, const RopeParams& p);

// out[t][i] = silu(gu[t][i]) * gu[t][hidden + i] for gu [rows][2*hidden], out [rows][hidden].
void SwiGlu(const float* gu, float* out, int64_t rows, int64_t hidden);
// The same for columns [i0, i1) of every row only (one thread's share), on the calling thread.
void SwiGluColumns(const float* gu, float* out, int64_t rows, int64_t hidden, int64_t i0,
                   int64_t i1);

// x[i] += y[i].
void Add(float* x, const float* y, int64_t n);

// sqrt(sum of x[i]^2), the L2 norm of x[n].
float L2Norm(const float* x, int64_t n);

// x . y / (|x| |y|) in double, 1 when either is zero; the cosine similarity of x[n] and y[n].
double CosineSimilarity(const float* x, const float* y, int64_t n);

// In-place softmax of x[n] (max-subtracted, as run.c).
void Softmax(float* x, int64_t n);

}  // namespace heavykv::cpu

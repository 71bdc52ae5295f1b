#include "kernels/cpu/ops.h"

#include <cmath>

namespace heavykv::cpu {
namespace {

// Elements below which a row-wise op runs on the calling thread: forking costs more.
constexpr int64_t kParallelMin = 1 << 16;

}  // namespace

void RmsNorm(const float* x, const float* w, float* out, int64_t rows, int64_t dim,
             float eps) {
#pragma omp parallel for if (rows * dim > kParallelMin)
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * dim;
    float* o = out + t * dim;
    float ss = 0.0f;
    for (int64_t j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    ss /= dim;
    ss += eps;
    ss = 1.0f / std::sqrt(ss);
    for (int64_t j = 0; j < dim; ++j) o[j] = w[j] * (ss * xr[j]);
  }
}

void Rope(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim, int64_t head_dim,
          const int32_t* pos, float theta) {
  RopeParams p;
  p.head_dim = head_dim;
  p.theta = theta;
  Rope(x, rows, row_stride, rot_dim, pos, p);
}

void RopeAngles(const int32_t* pos, int64_t rows, const RopeParams& p, float* cos_sin) {
  const int64_t head_dim = p.head_dim, half = head_dim / 2;
  for (int64_t t = 0; t < rows; ++t) {
    // The angle depends only on (pos, i mod head_dim): each once per row, with the same float
    // operations as run.c, so rotations agree with it bit for bit.
    float* cos_tab = cos_sin + t * head_dim;
    float* sin_tab = cos_tab + half;
    for (int64_t i = 0; i < head_dim; i += 2) {
      float freq = 1.0f / powf(p.theta, i / (float)head_dim);
      if (p.freq_factors != nullptr) freq /= p.freq_factors[i / 2];
      float val = pos[t] * freq;
      cos_tab[i / 2] = cosf(val);
      sin_tab[i / 2] = sinf(val);
    }
  }
}

void RopeWithAngles(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim,
                    const float* cos_sin, const RopeParams& p) {
  const int64_t head_dim = p.head_dim, half = head_dim / 2;
  for (int64_t t = 0; t < rows; ++t) {
    const float* cos_tab = cos_sin + t * head_dim;
    const float* sin_tab = cos_tab + half;
    float* r = x + t * row_stride;
    if (p.neox) {
      for (int64_t h = 0; h < rot_dim; h += head_dim) {
        for (int64_t j = 0; j < half; ++j) {
          float v0 = r[h + j], v1 = r[h + j + half];
          r[h + j] = v0 * cos_tab[j] - v1 * sin_tab[j];
          r[h + j + half] = v0 * sin_tab[j] + v1 * cos_tab[j];
        }
      }
      continue;
    }
    for (int64_t i = 0; i < rot_dim; i += 2) {
      int64_t j = (i % head_dim) / 2;
      float v0 = r[i], v1 = r[i + 1];
      r[i] = v0 * cos_tab[j] - v1 * sin_tab[j];
      r[i + 1] = v0 * sin_tab[j] + v1 * cos_tab[j];
    }
  }
}

void Rope(float* x, int64_t rows, int64_t row_stride, int64_t rot_dim, const int32_t* pos,
          const RopeParams& p) {
#pragma omp parallel for if (rows * rot_dim > kParallelMin)
  for (int64_t t = 0; t < rows; ++t) {
    float cos_sin[1024];
    RopeAngles(pos + t, 1, p, cos_sin);
    RopeWithAngles(x + t * row_stride, 1, row_stride, rot_dim, cos_sin, p);
  }
}

void SwiGluColumns(const float* gu, float* out, int64_t rows, int64_t hidden, int64_t i0,
                   int64_t i1) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* g = gu + t * 2 * hidden;
    const float* u = g + hidden;
    float* o = out + t * hidden;
    for (int64_t i = i0; i < i1; ++i) {
      float val = g[i];
      val *= (1.0f / (1.0f + expf(-val)));
      o[i] = val * u[i];
    }
  }
}

void SwiGlu(const float* gu, float* out, int64_t rows, int64_t hidden) {
#pragma omp parallel for if (rows * hidden > kParallelMin)
  for (int64_t t = 0; t < rows; ++t) {
    SwiGluColumns(gu + t * 2 * hidden, out + t * hidden, 1, hidden, 0, hidden);
  }
}

void Add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

float L2Norm(const float* x, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  return std::sqrt(sum);
}

double CosineSimilarity(const float* x, const float* y, int64_t n) {
  double xy = 0, xx = 0, yy = 0;
  for (int64_t i = 0; i < n; ++i) {
    xy += double(x[i]) * y[i];
    xx += double(x[i]) * x[i];
    yy += double(y[i]) * y[i];
  }
  return xx > 0 && yy > 0 ? xy / std::sqrt(xx * yy) : 1.0;
}

void Softmax(float* x, int64_t n) {
  float max_val = x[0];
  for (int64_t i = 1; i < n; ++i) max_val = x[i] > max_val ? x[i] : max_val;
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = expf(x[i] - max_val);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

}  // namespace heavykv::cpu

/*
** optim.c — CPU kernels of the fused optimizer updates and the gradient norm.
**
** The updates are elementwise, one pass over p, g and the state (memory-bound: the fused
** AdamW reads 4 and writes 3 floats per parameter), split across threads in static
** chunks and vectorised. The sum of squares splits a tensor into a fixed number of
** contiguous ranges whatever the thread count, and adds the range totals in order, so
** the norm is reproducible bit for bit.
*/
#include "optim.h"
#include "tt_internal.h"
#include <math.h>

enum { SUMSQ_RANGES = 64 };

static int adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                 float beta1, float beta2, float eps, float weight_decay, float bc1,
                 float bc2) {
  float decay = 1.0f - lr * weight_decay, step = lr / bc1, inv_sqrt_bc2 = 1.0f / sqrtf(bc2);
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  }
  return 0;
}

static int sgd(float *p, const float *g, float *buf, int64_t n, float lr, float mu,
               float weight_decay) {
  if (buf) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t i = 0; i < n; i++) {
      float b = mu * buf[i] + g[i] + weight_decay * p[i];
      buf[i] = b;
      p[i] -= lr * b;
    }
  } else {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t i = 0; i < n; i++) p[i] -= lr * (g[i] + weight_decay * p[i]);
  }
  return 0;
}

static int sum_squares(const float *x, int64_t n, double *out) {
  double part[SUMSQ_RANGES];
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int r = 0; r < SUMSQ_RANGES; r++) {
    int64_t lo = n * r / SUMSQ_RANGES, hi = n * (r + 1) / SUMSQ_RANGES;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
    part[r] = s;
  }
  double total = 0.0;
  for (int r = 0; r < SUMSQ_RANGES; r++) total += part[r];
  *out = total;
  return 0;
}

static int scale(float *x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
  return 0;
}

const tt_optim_kernels tt_optim_cpu = {
  .adamw = adamw,
  .sgd = sgd,
  .sum_squares = sum_squares,
  .scale = scale,
};

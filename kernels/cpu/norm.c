/*
** norm.c — CPU kernels of RMSNorm and LayerNorm over the last dim.
**
** Forward and the input gradient are row-local: rows split across threads, each row's
** reductions vectorised with `omp simd reduction`. The weight and bias gradients sum over
** all rows; to stay deterministic for any thread count without a workspace they run as a
** second pass over bands of columns: each thread owns some columns and sums them over the
** rows in row order (float64 accumulators).
*/
#include "norm.h"
#include "kernel.h"
#include <math.h>
#include <omp.h>

enum { COL_BAND = 64 };   /* columns per band of the parameter-gradient pass */

/* Column band width: 64 floats when there are enough bands to feed every thread, else
** narrower (down to one cache line). Only the work split changes, not the sums. */
static int64_t col_band(int64_t D) {
  int64_t w = COL_BAND, nt = omp_get_max_threads();
  while (w > 16 && (D + w - 1) / w < nt) w /= 2;
  return w;
}

/* dweight[j] = sum_n dout[n, j] * xhat[n, j], dbias[j] = sum_n dout[n, j], where
** xhat = (x - mean[n]) * rstd[n] (mean NULL: RMSNorm, no centring). Either output may be
** NULL. dout, x: (N, D), mean, rstd: (N), dweight, dbias: (D) */
static void param_grads(float *dweight, float *dbias, const float *dout, const float *x,
                        const float *mean, const float *rstd, int64_t N, int64_t D) {
  int64_t w = col_band(D), nbands = (D + w - 1) / w;
#pragma omp parallel for schedule(static) if (N * D > TT_PARALLEL_GRAIN)
  for (int64_t b = 0; b < nbands; b++) {
    int64_t j0 = b * w, nj = D - j0 < w ? D - j0 : w;
    double accw[COL_BAND], accb[COL_BAND];
    for (int64_t j = 0; j < nj; j++) accw[j] = accb[j] = 0.0;
    for (int64_t n = 0; n < N; n++) {
      const float *dy = dout + n * D + j0, *xr = x + n * D + j0;
      float mu = mean ? mean[n] : 0.0f, r = rstd[n];
      for (int64_t j = 0; j < nj; j++) {
        accw[j] += (double)(dy[j] * ((xr[j] - mu) * r));
        accb[j] += (double)dy[j];
      }
    }
    for (int64_t j = 0; j < nj; j++) {
      if (dweight) dweight[j0 + j] = (float)accw[j];
      if (dbias) dbias[j0 + j] = (float)accb[j];
    }
  }
}

/* -- RMSNorm -------------------------------------------------------------------------- */

/* x, out: (N, D), weight: (D) or NULL, rstd: (N) */
static int rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight,
                           int64_t N, int64_t D, float eps) {
#pragma omp parallel for schedule(static) if (N * D > TT_PARALLEL_GRAIN)
  for (int64_t n = 0; n < N; n++) {
    const float *xr = x + n * D;
    float *yr = out + n * D;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < D; j++) ss += xr[j] * xr[j];
    float r = 1.0f / sqrtf(ss / (float)D + eps);
    rstd[n] = r;
    if (weight) {
#pragma omp simd
      for (int64_t j = 0; j < D; j++) yr[j] = xr[j] * r * weight[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < D; j++) yr[j] = xr[j] * r;
    }
  }
  return 0;
}

/* With g = dout * weight: dx = rstd * (g - x * rstd^2 * mean(g * x)).
** dweight = sum over rows of dout * x * rstd. */
static int rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                            const float *weight, const float *rstd, int64_t N, int64_t D) {
  if (dx) {
#pragma omp parallel for schedule(static) if (N * D > TT_PARALLEL_GRAIN)
    for (int64_t n = 0; n < N; n++) {
      const float *dy = dout + n * D, *xr = x + n * D;
      float *dxr = dx + n * D;
      float r = rstd[n], dot = 0.0f;
      if (weight) {
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < D; j++) dot += dy[j] * weight[j] * xr[j];
      } else {
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < D; j++) dot += dy[j] * xr[j];
      }
      float c = r * r * dot / (float)D;
      if (weight) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) dxr[j] = r * (dy[j] * weight[j] - xr[j] * c);
      } else {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) dxr[j] = r * (dy[j] - xr[j] * c);
      }
    }
  }
  if (dweight && weight) param_grads(dweight, NULL, dout, x, NULL, rstd, N, D);
  return 0;
}

/* -- LayerNorm ------------------------------------------------------------------------ */

/* x, out: (N, D), weight, bias: (D) or NULL, mean, rstd: (N). The variance is taken
** around the mean in a second pass (no E[x^2] - E[x]^2 cancellation). */
static int layernorm_forward(float *out, float *mean, float *rstd, const float *x,
                             const float *weight, const float *bias, int64_t N, int64_t D,
                             float eps) {
#pragma omp parallel for schedule(static) if (N * D > TT_PARALLEL_GRAIN)
  for (int64_t n = 0; n < N; n++) {
    const float *xr = x + n * D;
    float *yr = out + n * D;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < D; j++) s += xr[j];
    float mu = s / (float)D, var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int64_t j = 0; j < D; j++) var += (xr[j] - mu) * (xr[j] - mu);
    float r = 1.0f / sqrtf(var / (float)D + eps);
    mean[n] = mu;
    rstd[n] = r;
#pragma omp simd
    for (int64_t j = 0; j < D; j++) {
      float v = (xr[j] - mu) * r;
      if (weight) v *= weight[j];
      if (bias) v += bias[j];
      yr[j] = v;
    }
  }
  return 0;
}

/* With g = dout * weight and xhat = (x - mean) * rstd:
** dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
static int layernorm_backward(float *dx, float *dweight, float *dbias, const float *dout,
                              const float *x, const float *weight, const float *mean,
                              const float *rstd, int64_t N, int64_t D) {
  if (dx) {
#pragma omp parallel for schedule(static) if (N * D > TT_PARALLEL_GRAIN)
    for (int64_t n = 0; n < N; n++) {
      const float *dy = dout + n * D, *xr = x + n * D;
      float *dxr = dx + n * D;
      float mu = mean[n], r = rstd[n], sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t j = 0; j < D; j++) {
        float g = weight ? dy[j] * weight[j] : dy[j];
        sg += g;
        sgx += g * (xr[j] - mu) * r;
      }
      float mg = sg / (float)D, mgx = sgx / (float)D;
#pragma omp simd
      for (int64_t j = 0; j < D; j++) {
        float g = weight ? dy[j] * weight[j] : dy[j];
        dxr[j] = r * (g - mg - (xr[j] - mu) * r * mgx);
      }
    }
  }
  if (dweight || dbias)
    param_grads(weight ? dweight : NULL, dbias, dout, x, mean, rstd, N, D);
  return 0;
}

const tt_norm_kernels tt_norm_cpu = {
  .rmsnorm_forward = rmsnorm_forward,
  .rmsnorm_backward = rmsnorm_backward,
  .layernorm_forward = layernorm_forward,
  .layernorm_backward = layernorm_backward,
};

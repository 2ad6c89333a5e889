/*
** fused.c — CPU twins of the fused memory-bound kernels (kernels/fused.h): residual add
** + RMSNorm or LayerNorm (+ cast) forward and backward, SwiGLU, GELU, on f32 or bf16 buffers with f32
** arithmetic inside.
**
** They follow the CUDA kernels step by step, roundings included: h is rounded to its
** dtype before its statistics are taken, and the weight gradient is summed in the same
** two stages (TT_FUSED_ROWS_PER_PART rows per partial in row order, then the partials in
** order), so the CUDA tests compare against the same arithmetic. Rows split across
** threads; the stage-one partials split by part, stage two by column.
*/
#include "fused.h"
#include "activation.h"
#include "kernel.h"
#include <math.h>

#include <omp.h>
#include <stdlib.h>
#include <string.h>

static inline float ld(const void *p, int dtype, int64_t i) {
  return dtype == TT_ELEM_BF16 ? tt_elem_bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void st(void *p, int dtype, int64_t i, float v) {
  if (dtype == TT_ELEM_BF16) ((uint16_t *)p)[i] = tt_elem_float_to_bf16(v);
  else ((float *)p)[i] = v;
}

/* v as stored in dtype and read back. */
static inline float rounded(float v, int dtype) {
  return dtype == TT_ELEM_BF16 ? tt_elem_bf16_to_float(tt_elem_float_to_bf16(v)) : v;
}

static int check_dtypes(const char *op, int dtype, int y_dtype) {
  TT_CHECK((dtype == TT_ELEM_F32 || dtype == TT_ELEM_BF16) && (y_dtype == TT_ELEM_F32 || y_dtype == TT_ELEM_BF16),
           "%s: dtypes %s -> %s; the fused kernels read and write f32 or bf16", op,
           tt_dtype_name(dtype), tt_dtype_name(y_dtype));
  return 0;
}

/* -- Residual add + RMSNorm or LayerNorm ----------------------------------------------- */

/* Both norms in one loop: mean NULL is RMSNorm (statistics of h^2, no centring, no bias);
** otherwise LayerNorm (mean, then the variance in a second pass over the rounded h). */
static int add_norm_forward(void *h, void *y, float *mean, float *rstd, const void *x,
                            const void *res, const float *w, const float *b, int64_t N,
                            int64_t D, float eps, int dtype, int y_dtype) {
  const char *op = mean ? "add_layernorm" : "add_rmsnorm";
  TT_TRY(check_dtypes(op, dtype, y_dtype));
  const int nthr = omp_get_max_threads();
  float *rows = tt_scratch_rows(op, D, 3, nthr);
  if (!rows) return -1;
#pragma omp parallel num_threads(nthr) if (N * D > TT_PARALLEL_GRAIN)
  {
    float *s0 = rows + (size_t)omp_get_thread_num() * 3 * D, *s1 = s0 + D, *s2 = s1 + D;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
      const int64_t o = n * D;
      const float *hv = tt_row_in(x, dtype, o, D, s0);
      if (res) {
        const float *rv = tt_row_in(res, dtype, o, D, s1);
        float *hw = tt_row_out(h, dtype, o, s0);
#pragma omp simd
        for (int64_t j = 0; j < D; j++) hw[j] = hv[j] + rv[j];
        if (dtype == TT_ELEM_BF16)
          for (int64_t j = 0; j < D; j++) hw[j] = rounded(hw[j], dtype);
        tt_row_done(h, dtype, o, D, hw);
        hv = hw;
      }
      float s = 0.0f, mu = 0.0f;
      if (mean) {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < D; j++) s += hv[j];
        mu = s / (float)D;
        s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < D; j++) s += (hv[j] - mu) * (hv[j] - mu);
        mean[n] = mu;
      } else {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < D; j++) s += hv[j] * hv[j];
      }
      const float r = 1.0f / sqrtf(s / (float)D + eps);
      rstd[n] = r;
      float *yv = tt_row_out(y, y_dtype, o, s2);
      if (w) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) yv[j] = (hv[j] - mu) * r * w[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) yv[j] = (hv[j] - mu) * r;
      }
      if (b) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) yv[j] += b[j];
      }
      tt_row_done(y, y_dtype, o, D, yv);
    }
  }
  free(rows);
  return 0;
}

/* Stage one: partials[p, j] = sum of dy xhat over rows [p R, (p+1) R), in row order
** (xhat = (h - mean) rstd, mean 0 for RMSNorm), and after the P x D of those, the sums of
** dy when db is wanted; stage two: dw[j], db[j] = sums of the partials in part order. */
static int param_grads(float *dw, float *db, float *partials, const void *dy, const void *h,
                       const float *mean, const float *rstd, int64_t N, int64_t D, int dtype,
                       int y_dtype) {
  const int64_t R = TT_FUSED_ROWS_PER_PART, P = (N + R - 1) / R;
  float *pw = partials, *pb = partials + P * D;
  const int nthr = omp_get_max_threads();
  float *rows = tt_scratch_rows("norm_backward", D, 2, nthr);
  if (!rows) return -1;
#pragma omp parallel num_threads(nthr) if (N * D > TT_PARALLEL_GRAIN)
  {
    float *s0 = rows + (size_t)omp_get_thread_num() * 2 * D, *s1 = s0 + D;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < P; p++) {
      float *sw = pw + p * D, *sb = pb + p * D;
      for (int64_t j = 0; j < D; j++) sw[j] = sb[j] = 0.0f;
      const int64_t end = (p + 1) * R < N ? (p + 1) * R : N;
      for (int64_t n = p * R; n < end; n++) {
        const float mu = mean ? mean[n] : 0.0f, r = rstd[n];
        const float *g = tt_row_in(dy, y_dtype, n * D, D, s0);
        if (dw) {
          const float *a = tt_row_in(h, dtype, n * D, D, s1);
#pragma omp simd
          for (int64_t j = 0; j < D; j++) sw[j] += g[j] * ((a[j] - mu) * r);
        }
        if (db) {
#pragma omp simd
          for (int64_t j = 0; j < D; j++) sb[j] += g[j];
        }
      }
    }
  }
  free(rows);
#pragma omp parallel for schedule(static) if (P * D > TT_PARALLEL_GRAIN)
  for (int64_t j = 0; j < D; j++) {
    float sw = 0.0f, sb = 0.0f;
    for (int64_t p = 0; p < P; p++) {
      sw += pw[p * D + j];
      sb += pb[p * D + j];
    }
    if (dw) dw[j] = sw;
    if (db) db[j] = sb;
  }
  return 0;
}

static int norm_backward(void *dh, float *dw, float *db, float *partials, const void *dy,
                         const void *dh_in, const void *h, const float *w, const float *mean,
                         const float *rstd, int64_t N, int64_t D, int dtype, int y_dtype) {
  const char *op = mean ? "layernorm_backward" : "rmsnorm_backward";
  TT_TRY(check_dtypes(op, dtype, y_dtype));
  if (!w) dw = NULL;
  TT_CHECK(!(dw || db) || partials, "%s: a weight gradient needs the partials workspace", op);
  if (dw || db) TT_TRY(param_grads(dw, db, partials, dy, h, mean, rstd, N, D, dtype, y_dtype));
  if (!dh) return 0;
  const int nthr = omp_get_max_threads();
  float *rows = tt_scratch_rows(op, D, 4, nthr);
  if (!rows) return -1;
#pragma omp parallel num_threads(nthr) if (N * D > TT_PARALLEL_GRAIN)
  {
    float *s0 = rows + (size_t)omp_get_thread_num() * 4 * D, *s1 = s0 + D, *s2 = s1 + D;
    float *gw = s2 + D;   /* g = dy w */
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
      const int64_t o = n * D;
      const float r = rstd[n], mu = mean ? mean[n] : 0.0f;
      const float *g = tt_row_in(dy, y_dtype, o, D, s0), *a = tt_row_in(h, dtype, o, D, s1);
      if (w) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) gw[j] = g[j] * w[j];
        g = gw;
      }
      float dot = 0.0f, sg = 0.0f;   /* sums of g (h - mu) and of g */
#pragma omp simd reduction(+ : dot, sg)
      for (int64_t j = 0; j < D; j++) {
        dot += g[j] * (a[j] - mu);
        sg += g[j];
      }
      const float c = dot * r * r * r / (float)D, m = mean ? sg / (float)D : 0.0f;
      /* dh may be dh_in itself: each element is read before it is written. */
      const float *d = dh_in ? tt_row_in(dh_in, dtype, o, D, s2) : NULL;
      float *out = tt_row_out(dh, dtype, o, s2);
      if (d) {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) out[j] = r * (g[j] - m) - (a[j] - mu) * c + d[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < D; j++) out[j] = r * (g[j] - m) - (a[j] - mu) * c;
      }
      tt_row_done(dh, dtype, o, D, out);
    }
  }
  free(rows);
  return 0;
}

/* -- SwiGLU ---------------------------------------------------------------------------- */

/* tt_vexpf's sigmoid (about 1 ulp, as CUDA's expf), so that the loops vectorise: libm's
** expf is a call per element. */
static inline float sigmoid(float g) { return tt_vsigmoidf(g); }

static int swiglu_forward(void *y, const void *gate, const void *up, int64_t n, int dtype) {
  TT_TRY(check_dtypes("swiglu", dtype, dtype));
  if (dtype == TT_ELEM_BF16) {   /* the dtype fixed, so that the loop vectorises */
    uint16_t *restrict yb = y;
    const uint16_t *restrict gb = gate, *restrict ub = up;
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t i = 0; i < n; i++) {
      const float g = tt_elem_bf16_to_float(gb[i]);
      yb[i] = tt_elem_float_to_bf16(g * sigmoid(g) * tt_elem_bf16_to_float(ub[i]));
    }
    return 0;
  }
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    const float g = ld(gate, dtype, i);
    st(y, dtype, i, g * sigmoid(g) * ld(up, dtype, i));
  }
  return 0;
}

static int swiglu_backward(void *dgate, void *dup, const void *dy, const void *gate,
                           const void *up, int64_t n, int dtype) {
  TT_TRY(check_dtypes("swiglu_backward", dtype, dtype));
  if (dtype == TT_ELEM_BF16 && dgate && dup) {   /* as swiglu_forward's */
    uint16_t *restrict dg = dgate, *restrict du = dup;
    const uint16_t *restrict yb = dy, *restrict gb = gate, *restrict ub = up;
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t i = 0; i < n; i++) {
      const float g = tt_elem_bf16_to_float(gb[i]), s = sigmoid(g);
      const float d = tt_elem_bf16_to_float(yb[i]);
      dg[i] = tt_elem_float_to_bf16(d * tt_elem_bf16_to_float(ub[i]) * s * (1.0f + g * (1.0f - s)));
      du[i] = tt_elem_float_to_bf16(d * g * s);
    }
    return 0;
  }
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    const float g = ld(gate, dtype, i), s = sigmoid(g), d = ld(dy, dtype, i);
    if (dgate) st(dgate, dtype, i, d * ld(up, dtype, i) * s * (1.0f + g * (1.0f - s)));
    if (dup) st(dup, dtype, i, d * g * s);
  }
  return 0;
}

/* -- GELU ------------------------------------------------------------------------------ */

static const float GELU_K = 0.7978845608028654f, GELU_C = 0.044715f;   /* sqrt(2/pi) */

static int gelu_forward(void *y, const void *x, int64_t n, int dtype) {
  TT_TRY(check_dtypes("gelu", dtype, dtype));
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    const float v = ld(x, dtype, i);
    st(y, dtype, i, v * sigmoid(2.0f * GELU_K * (v + GELU_C * v * v * v)));
  }
  return 0;
}

static int gelu_backward(void *dx, const void *dy, const void *x, int64_t n, int dtype) {
  TT_TRY(check_dtypes("gelu_backward", dtype, dtype));
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    const float v = ld(x, dtype, i), s = sigmoid(2.0f * GELU_K * (v + GELU_C * v * v * v));
    const float du = GELU_K * (1.0f + 3.0f * GELU_C * v * v);
    st(dx, dtype, i, ld(dy, dtype, i) * (s + 2.0f * v * s * (1.0f - s) * du));
  }
  return 0;
}

const tt_fused_kernels tt_fused_cpu = {
  .add_norm_forward = add_norm_forward,
  .norm_backward = norm_backward,
  .swiglu_forward = swiglu_forward,
  .swiglu_backward = swiglu_backward,
  .gelu_forward = gelu_forward,
  .gelu_backward = gelu_backward,
};

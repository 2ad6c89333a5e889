/*
** fused.c — CPU twins of the fused memory-bound kernels (kernels/fused.h): residual add
** + RMSNorm (+ cast) forward and backward, SwiGLU, on f32 or bf16 buffers with f32
** arithmetic inside.
**
** They follow the CUDA kernels step by step, roundings included: h is rounded to its
** dtype before its statistics are taken, and the weight gradient is summed in the same
** two stages (TT_FUSED_ROWS_PER_PART rows per partial in row order, then the partials in
** order), so the CUDA tests compare against the same arithmetic. Rows split across
** threads; the stage-one partials split by part, stage two by column.
*/
#include "fused.h"
#include "tt_internal.h"
#include <math.h>

static inline float ld(const void *p, int dtype, int64_t i) {
  return dtype == TT_BF16 ? tt_bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void st(void *p, int dtype, int64_t i, float v) {
  if (dtype == TT_BF16) ((uint16_t *)p)[i] = tt_float_to_bf16(v);
  else ((float *)p)[i] = v;
}

/* v as stored in dtype and read back. */
static inline float rounded(float v, int dtype) {
  return dtype == TT_BF16 ? tt_bf16_to_float(tt_float_to_bf16(v)) : v;
}

static int check_dtypes(const char *op, int dtype, int y_dtype) {
  TT_CHECK((dtype == TT_F32 || dtype == TT_BF16) && (y_dtype == TT_F32 || y_dtype == TT_BF16),
           "%s: dtypes %s -> %s; the fused kernels read and write f32 or bf16", op,
           tt_dtype_name(dtype), tt_dtype_name(y_dtype));
  return 0;
}

/* -- Residual add + RMSNorm ------------------------------------------------------------ */

static int add_rmsnorm_forward(void *h, void *y, float *rstd, const void *x, const void *res,
                               const float *w, int64_t N, int64_t D, float eps, int dtype,
                               int y_dtype) {
  TT_TRY(check_dtypes("add_rmsnorm", dtype, y_dtype));
  /* Without a residual the input is h. */
  const void *hin = res ? h : x;
#pragma omp parallel for schedule(static) if (N * D > TT_PARALLEL_GRAIN)
  for (int64_t n = 0; n < N; n++) {
    const int64_t o = n * D;
    float ss = 0.0f;
    for (int64_t j = 0; j < D; j++) {
      float v = ld(x, dtype, o + j);
      if (res) {
        v = rounded(v + ld(res, dtype, o + j), dtype);
        st(h, dtype, o + j, v);
      }
      ss += v * v;
    }
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
    rstd[n] = r;
    for (int64_t j = 0; j < D; j++)
      st(y, y_dtype, o + j, ld(hin, dtype, o + j) * r * (w ? w[j] : 1.0f));
  }
  return 0;
}

/* Stage one: partials[p, j] = sum of dy h rstd over rows [p R, (p+1) R), in row order;
** stage two: dw[j] = sum of partials[., j] in part order. */
static void weight_grad(float *dw, float *partials, const void *dy, const void *h,
                        const float *rstd, int64_t N, int64_t D, int dtype, int y_dtype) {
  const int64_t R = TT_FUSED_ROWS_PER_PART, P = (N + R - 1) / R;
#pragma omp parallel for schedule(static) if (N * D > TT_PARALLEL_GRAIN)
  for (int64_t p = 0; p < P; p++) {
    float *part = partials + p * D;
    for (int64_t j = 0; j < D; j++) part[j] = 0.0f;
    const int64_t end = (p + 1) * R < N ? (p + 1) * R : N;
    for (int64_t n = p * R; n < end; n++)
      for (int64_t j = 0; j < D; j++)
        part[j] += ld(dy, y_dtype, n * D + j) * (ld(h, dtype, n * D + j) * rstd[n]);
  }
#pragma omp parallel for schedule(static) if (P * D > TT_PARALLEL_GRAIN)
  for (int64_t j = 0; j < D; j++) {
    float s = 0.0f;
    for (int64_t p = 0; p < P; p++) s += partials[p * D + j];
    dw[j] = s;
  }
}

static int rmsnorm_backward(void *dh, float *dw, float *partials, const void *dy,
                            const void *dh_in, const void *h, const float *w,
                            const float *rstd, int64_t N, int64_t D, int dtype, int y_dtype) {
  TT_TRY(check_dtypes("rmsnorm_backward", dtype, y_dtype));
  TT_CHECK(!dw || partials, "rmsnorm_backward: a weight gradient needs the partials workspace");
  if (dw && w) weight_grad(dw, partials, dy, h, rstd, N, D, dtype, y_dtype);
  if (!dh) return 0;
#pragma omp parallel for schedule(static) if (N * D > TT_PARALLEL_GRAIN)
  for (int64_t n = 0; n < N; n++) {
    const int64_t o = n * D;
    const float r = rstd[n];
    float dot = 0.0f;
    for (int64_t j = 0; j < D; j++)
      dot += ld(dy, y_dtype, o + j) * (w ? w[j] : 1.0f) * ld(h, dtype, o + j);
    const float c = dot * r * r * r / (float)D;
    for (int64_t j = 0; j < D; j++) {
      float v = r * ld(dy, y_dtype, o + j) * (w ? w[j] : 1.0f) - ld(h, dtype, o + j) * c;
      if (dh_in) v += ld(dh_in, dtype, o + j);
      st(dh, dtype, o + j, v);
    }
  }
  return 0;
}

/* -- SwiGLU ---------------------------------------------------------------------------- */

static inline float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

static int swiglu_forward(void *y, const void *gate, const void *up, int64_t n, int dtype) {
  TT_TRY(check_dtypes("swiglu", dtype, dtype));
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
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    const float g = ld(gate, dtype, i), s = sigmoid(g), d = ld(dy, dtype, i);
    if (dgate) st(dgate, dtype, i, d * ld(up, dtype, i) * s * (1.0f + g * (1.0f - s)));
    if (dup) st(dup, dtype, i, d * g * s);
  }
  return 0;
}

const tt_fused_kernels tt_fused_cpu = {
  .add_rmsnorm_forward = add_rmsnorm_forward,
  .rmsnorm_backward = rmsnorm_backward,
  .swiglu_forward = swiglu_forward,
  .swiglu_backward = swiglu_backward,
};

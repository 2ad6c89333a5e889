/*
** rope.c — CPU kernels of rotary position embedding.
**
** One (b, t) slab holds H heads of Dh values that all use the same T-row of the angle
** table, so the loops run over (b, t) in parallel and reuse that row across heads. The
** rotate-half layout vectorises directly (x[i] and x[i + half] are contiguous runs); the
** interleaved layout works on (even, odd) pairs.
*/
#include "rope.h"
#include "tt_internal.h"
#include <math.h>

/* table: (2, T, half) = cos then sin of pos[t] * theta^(-2i / Dh) */
static int rope_table(float *table, const void *positions, int pos_i64, int64_t T,
                      int64_t Dh, double theta) {
  int64_t half = Dh / 2;
  float *cs = table, *sn = table + T * half;
  /* frequency-major: one pow per frequency; the T angles of a frequency are independent */
#pragma omp parallel for schedule(static) if (T * half > TT_PARALLEL_GRAIN / 16)
  for (int64_t i = 0; i < half; i++) {
    double freq = pow(theta, -2.0 * (double)i / (double)Dh);
    for (int64_t t = 0; t < T; t++) {
      double p = positions ? (double)tt_index_at(positions, pos_i64 ? TT_I64 : TT_I32, t)
                           : (double)t;
      cs[t * half + i] = (float)cos(p * freq);
      sn[t * half + i] = (float)sin(p * freq);
    }
  }
  return 0;
}

/* Rotates every pair by the table angle times `dir` (+1 forward, -1 backward).
** in, out: (B, T, H, Dh), table: (2, T, half) */
static void rope_apply(float *out, const float *in, const float *table, int64_t B,
                       int64_t T, int64_t H, int64_t Dh, int interleaved, float dir) {
  int64_t half = Dh / 2;
  const float *cos_t = table, *sin_t = table + T * half;
#pragma omp parallel for schedule(static) if (B * T * H * Dh > TT_PARALLEL_GRAIN)
  for (int64_t bt = 0; bt < B * T; bt++) {
    int64_t t = bt % T;
    const float *c = cos_t + t * half, *s = sin_t + t * half;
    for (int64_t h = 0; h < H; h++) {
      const float *x = in + (bt * H + h) * Dh;
      float *y = out + (bt * H + h) * Dh;
      if (interleaved) {
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
          float x0 = x[2 * i], x1 = x[2 * i + 1], si = dir * s[i];
          y[2 * i] = x0 * c[i] - x1 * si;
          y[2 * i + 1] = x1 * c[i] + x0 * si;
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < half; i++) {
          float x0 = x[i], x1 = x[i + half], si = dir * s[i];
          y[i] = x0 * c[i] - x1 * si;
          y[i + half] = x1 * c[i] + x0 * si;
        }
      }
    }
  }
}

static int rope_forward(float *out, const float *x, const float *table, int64_t B,
                        int64_t T, int64_t H, int64_t Dh, int interleaved) {
  rope_apply(out, x, table, B, T, H, Dh, interleaved, 1.0f);
  return 0;
}

static int rope_backward(float *dx, const float *dout, const float *table, int64_t B,
                         int64_t T, int64_t H, int64_t Dh, int interleaved) {
  rope_apply(dx, dout, table, B, T, H, Dh, interleaved, -1.0f);
  return 0;
}

const tt_rope_kernels tt_rope_cpu = {
  .table = rope_table,
  .forward = rope_forward,
  .backward = rope_backward,
};

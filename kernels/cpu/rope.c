/*
** rope.c — CPU kernels of rotary position embedding.
**
** One (b, t) slab holds H heads of Dh values that all use the same T-row of the angle
** table, so the loops run over (b, t) in parallel and reuse that row across heads. The
** rotate-half layout vectorises directly (x[i] and x[i + half] are contiguous runs); the
** interleaved layout works on (even, odd) pairs. bf16 slabs are rotated in an f32 copy and
** rounded once; out may be the input itself (in place).
*/
#include "rope.h"
#include "kernel.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>

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
      double p = positions ? (double)tt_index_at(positions, pos_i64 ? TT_ELEM_I64 : TT_ELEM_I32, t)
                           : (double)t;
      cs[t * half + i] = (float)cos(p * freq);
      sn[t * half + i] = (float)sin(p * freq);
    }
  }
  return 0;
}

/* Rotates the pairs of one (b, t) slab of H heads by the table row (c, s) times `dir`
** (+1 forward, -1 backward); y may be x. */
static void rotate_slab(float *y, const float *x, const float *c, const float *s, int64_t H,
                        int64_t Dh, int interleaved, float dir) {
  const int64_t half = Dh / 2;
  for (int64_t h = 0; h < H; h++, x += Dh, y += Dh) {
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

/* Every (b, t) slab rotated; bf16 slabs through an f32 copy (one per thread), rounded
** once. in, out: (B, T, H, Dh) in dtype, out may be in; table: (2, T, half). */
static int rope_apply(void *out, const void *in, const float *table, int64_t B, int64_t T,
                      int64_t H, int64_t Dh, int interleaved, int dtype, float dir) {
  TT_CHECK(dtype == TT_ELEM_F32 || dtype == TT_ELEM_BF16, "rope: x is %s; expected f32 or bf16",
           tt_dtype_name(dtype));
  const int64_t half = Dh / 2, slab = H * Dh;
  const float *cos_t = table, *sin_t = table + T * half;
  const int nthr = omp_get_max_threads(), low = dtype == TT_ELEM_BF16;
  float *scratch = low ? tt_scratch_rows("rope", slab, 1, nthr) : NULL;
  if (low && !scratch) return -1;
#pragma omp parallel num_threads(nthr) if (B * T * slab > TT_PARALLEL_GRAIN)
  {
    float *f = low ? scratch + (size_t)omp_get_thread_num() * slab : NULL;
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
      const int64_t t = bt % T, o = bt * slab;
      const float *c = cos_t + t * half, *s = sin_t + t * half;
      /* out may be in: a bf16 slab is read into f before it is written back */
      const float *x = tt_row_in(in, dtype, o, slab, f);
      float *y = tt_row_out(out, dtype, o, f);
      rotate_slab(y, x, c, s, H, Dh, interleaved, dir);
      tt_row_done(out, dtype, o, slab, y);
    }
  }
  free(scratch);
  return 0;
}

static int rope_forward(void *out, const void *x, const float *table, int64_t B, int64_t T,
                        int64_t H, int64_t Dh, int interleaved, int dtype) {
  return rope_apply(out, x, table, B, T, H, Dh, interleaved, dtype, 1.0f);
}

static int rope_backward(void *dx, const void *dout, const float *table, int64_t B,
                         int64_t T, int64_t H, int64_t Dh, int interleaved, int dtype) {
  return rope_apply(dx, dout, table, B, T, H, Dh, interleaved, dtype, -1.0f);
}

const tt_rope_kernels tt_rope_cpu = {
  .table = rope_table,
  .forward = rope_forward,
  .backward = rope_backward,
};

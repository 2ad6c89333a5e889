/*
** reduce.c — CPU kernels of the reduction family (see kernels/reduce.h).
**
** Input is a contiguous (outer, r, inner) block, reduced over r. Two layouts matter:
** inner == 1 (reducing the last dims: each output is a dense row) and inner > 1
** (reducing leading or middle dims, e.g. a bias gradient: columns). Rows are summed
** with an `omp simd` double reduction; columns run over blocks of `inner` with one
** double accumulator per column, so the loop over a block vectorises. Row maxima and the
** softmax exponential are written with 8-lane vector types, since compilers do not
** vectorise a NaN-aware max or a libm expf on their own.
*/
#include "reduce.h"
#include "kernel.h"
#include <omp.h>

/* Columns handled together by one task of a column kernel. */
enum { COL_BLOCK = 256 };

/* Eight-lane vectors (GCC/clang vector extensions; lowered to whatever the target has)
** for the loops compilers will not vectorise on their own: max and exp. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* Largest of x (n >= 1); *has_nan set when x holds a NaN (the result is then
** meaningless). */
static float row_max(const float *x, int64_t n, int *has_nan) {
  int64_t k = 0;
  float m = x[0];
  int nan = 0;
  if (n >= 8) {
    v8f acc;
    v8i bad = {0};
    memcpy(&acc, x, sizeof acc);
    for (k = 8; k + 8 <= n; k += 8) {
      v8f v;
      memcpy(&v, x + k, sizeof v);
      const v8i gt = v > acc;
      acc = (v8f)(((v8i)v & gt) | ((v8i)acc & ~gt));
      bad |= v != v;
    }
    bad |= acc != acc;
    for (int j = 0; j < 8; j++) {
      m = acc[j] > m ? acc[j] : m;
      nan |= bad[j] != 0;
    }
  }
  for (; k < n; k++) {
    m = x[k] > m ? x[k] : m;
    nan |= x[k] != x[k];
  }
  *has_nan = nan;
  return m;
}

/* Column block size giving at least two tasks per thread when there is enough work. */
static int64_t col_block(int64_t outer, int64_t inner) {
  int64_t bs = COL_BLOCK;
  const int64_t want = 2 * (int64_t)omp_get_max_threads();
  while (bs > 16 && outer * ((inner + bs - 1) / bs) < want) bs /= 2;
  return bs;
}

static double row_sum(const float *x, int64_t n) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; i++) acc += x[i];
  return acc;
}

/* -- Sum ----------------------------------------------------------------------------- */

static int cpu_sum(float *out, const float *x, int64_t outer, int64_t r, int64_t inner,
                   float scale) {
  const int64_t work = outer * r * inner;
  if (inner == 1) {
    if (outer >= omp_get_max_threads() || work <= TT_PARALLEL_GRAIN) {
#pragma omp parallel for if (work > TT_PARALLEL_GRAIN) schedule(static)
      for (int64_t o = 0; o < outer; o++) out[o] = (float)(row_sum(x + o * r, r) * scale);
      return 0;
    }
    /* Few long rows (a full reduction): split each row across the threads. */
    for (int64_t o = 0; o < outer; o++) {
      const float *row = x + o * r;
      double acc = 0.0;
#pragma omp parallel for simd reduction(+ : acc) schedule(static)
      for (int64_t i = 0; i < r; i++) acc += row[i];
      out[o] = (float)(acc * scale);
    }
    return 0;
  }
  const int64_t bs = col_block(outer, inner);
  const int64_t nblocks = (inner + bs - 1) / bs;
#pragma omp parallel for if (work > TT_PARALLEL_GRAIN) schedule(static)
  for (int64_t task = 0; task < outer * nblocks; task++) {
    const int64_t o = task / nblocks, i0 = (task % nblocks) * bs;
    const int64_t n = inner - i0 < bs ? inner - i0 : bs;
    double acc[COL_BLOCK];
    for (int64_t j = 0; j < n; j++) acc[j] = 0.0;
    for (int64_t k = 0; k < r; k++) {
      const float *restrict row = x + (o * r + k) * inner + i0;
      for (int64_t j = 0; j < n; j++) acc[j] += row[j];
    }
    float *restrict dst = out + o * inner + i0;
    for (int64_t j = 0; j < n; j++) dst[j] = (float)(acc[j] * scale);
  }
  return 0;
}

static int cpu_sum_backward(float *gx, const float *g, int64_t outer, int64_t r,
                            int64_t inner, float scale) {
  const int64_t rows = outer * r;
#pragma omp parallel for if (rows * inner > TT_PARALLEL_GRAIN) schedule(static)
  for (int64_t row = 0; row < rows; row++) {
    const float *restrict src = g + (row / r) * inner;
    float *restrict dst = gx + row * inner;
    for (int64_t j = 0; j < inner; j++) dst[j] = src[j] * scale;
  }
  return 0;
}

/* -- Max ----------------------------------------------------------------------------- */

/* v replaces the running maximum m when larger, or when v is the first NaN. */
static inline int max_takes(float v, float m) { return v > m || (v != v && m == m); }

/* Index of the first maximum of row (r), a NaN counting as the maximum. A vectorised
** pass finds the value; a second one finds where it first occurs. */
static int64_t row_argmax(const float *row, int64_t r) {
  int nan = 0;
  const float m = row_max(row, r, &nan);
  for (int64_t k = 0; k < r; k++)
    if (nan ? row[k] != row[k] : row[k] == m) return k;
  return 0;
}

static int cpu_max(float *out, int64_t *idx, const float *x, int64_t outer, int64_t r,
                   int64_t inner) {
  const int64_t work = outer * r * inner;
  if (inner == 1) {
#pragma omp parallel for if (work > TT_PARALLEL_GRAIN) schedule(static)
    for (int64_t o = 0; o < outer; o++) {
      const int64_t at = row_argmax(x + o * r, r);
      out[o] = x[o * r + at];
      idx[o] = at;
    }
    return 0;
  }
  const int64_t bs = col_block(outer, inner);
  const int64_t nblocks = (inner + bs - 1) / bs;
#pragma omp parallel for if (work > TT_PARALLEL_GRAIN) schedule(static)
  for (int64_t task = 0; task < outer * nblocks; task++) {
    const int64_t o = task / nblocks, i0 = (task % nblocks) * bs;
    const int64_t n = inner - i0 < bs ? inner - i0 : bs;
    float *restrict m = out + o * inner + i0;
    int64_t *restrict at = idx + o * inner + i0;
    const float *first = x + o * r * inner + i0;
    for (int64_t j = 0; j < n; j++) {
      m[j] = first[j];
      at[j] = 0;
    }
    for (int64_t k = 1; k < r; k++) {
      const float *restrict row = x + (o * r + k) * inner + i0;
      for (int64_t j = 0; j < n; j++)
        if (max_takes(row[j], m[j])) {
          m[j] = row[j];
          at[j] = k;
        }
    }
  }
  return 0;
}

static int cpu_max_backward(float *gx, const float *g, const int64_t *idx, int64_t outer,
                            int64_t r, int64_t inner) {
#pragma omp parallel for if (outer * r * inner > TT_PARALLEL_GRAIN) schedule(static)
  for (int64_t o = 0; o < outer; o++) {
    float *restrict block = gx + o * r * inner;
    for (int64_t j = 0; j < r * inner; j++) block[j] = 0.0f;
    for (int64_t j = 0; j < inner; j++) block[idx[o * inner + j] * inner + j] = g[o * inner + j];
  }
  return 0;
}

/* -- Softmax ------------------------------------------------------------------------- */

/* e^x for eight x <= 0 at once (softmax arguments after subtracting the max), in GCC
** vector extensions so it vectorises on any target: x = n ln2 + f with |f| <= ln2 / 2,
** e^f from its degree-7 Taylor polynomial (relative error below 2e-8), 2^n built in the
** exponent bits. Arguments under -87 give e^-87 (~1.6e-38) instead of smaller values. */
static inline v8f exp8_nonpos(v8f x) {
  const v8f lo = {-87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f};
  const v8i under = x < lo;
  x = (v8f)(((v8i)lo & under) | ((v8i)x & ~under));
  /* Adding and subtracting 1.5 * 2^23 rounds to the nearest integer. */
  const v8f n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const v8f f = x - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
  v8f p = f * (1.0f / 5040.0f) + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  return p * (v8f)bits;
}

/* y (n) = e^(x - m), x - m <= 0 (y may be x); the tail goes through a padded block. */
static void exp_shifted(float *y, const float *x, float m, int64_t n) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    v8f v;
    memcpy(&v, x + k, sizeof v);
    v = exp8_nonpos(v - m);
    memcpy(y + k, &v, sizeof v);
  }
  if (k < n) {
    v8f v = {0};
    memcpy(&v, x + k, sizeof(float) * (size_t)(n - k));
    v = exp8_nonpos(v - m);
    memcpy(y + k, &v, sizeof(float) * (size_t)(n - k));
  }
}

static void softmax_row(float *restrict y, const float *restrict x, int64_t r) {
  /* A NaN in the row turns the sum, hence the whole row, into NaN. */
  int nan = 0;
  const float m = row_max(x, r, &nan);
  exp_shifted(y, x, m, r);
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < r; k++) s += y[k];
  const float inv = (float)(1.0 / s);
  for (int64_t k = 0; k < r; k++) y[k] *= inv;
}

static int cpu_softmax(float *y, const float *x, int64_t outer, int64_t r, int64_t inner) {
  const int64_t work = outer * r * inner;
  if (inner == 1) {
#pragma omp parallel for if (work > TT_PARALLEL_GRAIN) schedule(static)
    for (int64_t o = 0; o < outer; o++) softmax_row(y + o * r, x + o * r, r);
    return 0;
  }
  const int64_t bs = col_block(outer, inner);
  const int64_t nblocks = (inner + bs - 1) / bs;
#pragma omp parallel for if (work > TT_PARALLEL_GRAIN) schedule(static)
  for (int64_t task = 0; task < outer * nblocks; task++) {
    const int64_t o = task / nblocks, i0 = (task % nblocks) * bs;
    const int64_t n = inner - i0 < bs ? inner - i0 : bs;
    const int64_t base = o * r * inner + i0;
    float m[COL_BLOCK];
    double s[COL_BLOCK];
    for (int64_t j = 0; j < n; j++) {
      m[j] = x[base + j];
      s[j] = 0.0;
    }
    for (int64_t k = 1; k < r; k++)
      for (int64_t j = 0; j < n; j++) {
        const float v = x[base + k * inner + j];
        m[j] = v > m[j] ? v : m[j];
      }
    for (int64_t k = 0; k < r; k++) {
      float *restrict yk = y + base + k * inner;
      const float *restrict xk = x + base + k * inner;
      for (int64_t j = 0; j < n; j++) yk[j] = xk[j] - m[j];
      exp_shifted(yk, yk, 0.0f, n);
      for (int64_t j = 0; j < n; j++) s[j] += yk[j];
    }
    for (int64_t j = 0; j < n; j++) m[j] = (float)(1.0 / s[j]);
    for (int64_t k = 0; k < r; k++)
      for (int64_t j = 0; j < n; j++) y[base + k * inner + j] *= m[j];
  }
  return 0;
}

static int cpu_softmax_backward(float *gx, const float *g, const float *y, int64_t outer,
                                int64_t r, int64_t inner) {
  const int64_t work = outer * r * inner;
  if (inner == 1) {
#pragma omp parallel for if (work > TT_PARALLEL_GRAIN) schedule(static)
    for (int64_t o = 0; o < outer; o++) {
      const float *restrict go = g + o * r, *restrict yo = y + o * r;
      float *restrict dst = gx + o * r;
      double dot = 0.0;
#pragma omp simd reduction(+ : dot)
      for (int64_t k = 0; k < r; k++) dot += (double)go[k] * yo[k];
      const float d = (float)dot;
      for (int64_t k = 0; k < r; k++) dst[k] = yo[k] * (go[k] - d);
    }
    return 0;
  }
  const int64_t bs = col_block(outer, inner);
  const int64_t nblocks = (inner + bs - 1) / bs;
#pragma omp parallel for if (work > TT_PARALLEL_GRAIN) schedule(static)
  for (int64_t task = 0; task < outer * nblocks; task++) {
    const int64_t o = task / nblocks, i0 = (task % nblocks) * bs;
    const int64_t n = inner - i0 < bs ? inner - i0 : bs;
    const int64_t base = o * r * inner + i0;
    double dot[COL_BLOCK];
    for (int64_t j = 0; j < n; j++) dot[j] = 0.0;
    for (int64_t k = 0; k < r; k++)
      for (int64_t j = 0; j < n; j++)
        dot[j] += (double)g[base + k * inner + j] * y[base + k * inner + j];
    for (int64_t k = 0; k < r; k++)
      for (int64_t j = 0; j < n; j++) {
        const int64_t at = base + k * inner + j;
        gx[at] = y[at] * (g[at] - (float)dot[j]);
      }
  }
  return 0;
}

const tt_reduce_kernels tt_reduce_cpu = {
  .sum = cpu_sum,
  .sum_backward = cpu_sum_backward,
  .max = cpu_max,
  .max_backward = cpu_max_backward,
  .softmax = cpu_softmax,
  .softmax_backward = cpu_softmax_backward,
};

/*
** tt_test.h — shared helpers for the Criterion tests of ops: deterministic random inputs
** (contiguous or strided), comparison against float64 reference loops, and gradient
** checks against central finite differences of the float64 reference.
**
** An op under test is a function (inputs -> output tensor); its reference is a function
** over float64 arrays in logical row-major order. The gradient check uses a random
** upstream weight w and compares the op's backward of sum(out * w) with the finite
** differences of sum(ref(x) * w), all in float64, so the reference carries no f32 noise.
*/
#ifndef TT_TEST_H
#define TT_TEST_H
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tetra.h"

typedef int (*tt_test_op_fn)(tt_tensor **in, tt_tensor **out, void *ctx);
typedef void (*tt_test_ref_fn)(double *const *in, double *out, void *ctx);

static inline uint64_t tt_test_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static inline double tt_test_uniform(uint64_t *s) {
  return (double)(tt_test_next(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

/* f32 tensor of `shape` with values in [-1, 1). */
static inline tt_tensor *tt_test_rand(const int64_t *shape, int ndim, uint64_t seed) {
  tt_tensor *t = NULL;
  cr_assert(tt_tensor_empty(shape, ndim, TT_F32, TT_CPU, &t) == 0, "%s", tt_last_error());
  float *p = tt_tensor_data(t);
  int64_t n = tt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) p[i] = (float)tt_test_uniform(&seed);
  return t;
}

/* Same logical shape, not contiguous: the last two dims of a bigger tensor, transposed
** back, with padding, so both strides differ from the contiguous ones. 1-D tensors are
** a stride-2 view. */
static inline tt_tensor *tt_test_rand_strided(const int64_t *shape, int ndim, uint64_t seed) {
  int64_t big[TT_MAX_DIMS];
  tt_tensor *base, *v1 = NULL, *v2 = NULL;
  if (ndim == 0) return tt_test_rand(shape, ndim, seed);
  if (ndim == 1) {
    big[0] = shape[0] * 2;
    base = tt_test_rand(big, 1, seed);
    int64_t n = shape[0];
    tt_tensor *v = NULL;   /* stride-2 view over base */
    cr_assert(tt_narrow(base, 0, 0, n, &v) == 0, "%s", tt_last_error());
    v->stride[0] = 2;
    tt_tensor_release(base);
    return v;
  }
  /* base: (..., cols + 3, rows) ; transpose -> (..., rows, cols + 3) ; narrow cols. */
  for (int i = 0; i < ndim - 2; i++) big[i] = shape[i];
  big[ndim - 2] = shape[ndim - 1] + 3;
  big[ndim - 1] = shape[ndim - 2];
  base = tt_test_rand(big, ndim, seed);
  cr_assert(tt_transpose(base, ndim - 2, ndim - 1, &v1) == 0, "%s", tt_last_error());
  cr_assert(tt_narrow(v1, ndim - 1, 1, shape[ndim - 1], &v2) == 0, "%s", tt_last_error());
  tt_tensor_release(base);
  tt_tensor_release(v1);
  return v2;
}

/* Index tensor (i32 or i64) with values in [0, hi). */
static inline tt_tensor *tt_test_index(const int64_t *shape, int ndim, int64_t hi, int dtype,
                                       uint64_t seed) {
  tt_tensor *t = NULL;
  cr_assert(tt_tensor_empty(shape, ndim, dtype, TT_CPU, &t) == 0, "%s", tt_last_error());
  int64_t n = tt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) {
    int64_t v = (int64_t)(tt_test_next(&seed) % (uint64_t)hi);
    if (dtype == TT_I32) ((int32_t *)tt_tensor_data(t))[i] = (int32_t)v;
    else ((int64_t *)tt_tensor_data(t))[i] = v;
  }
  return t;
}

static inline double *tt_test_to_f64(const tt_tensor *t) {
  int64_t n = tt_tensor_numel(t);
  double *d = malloc(sizeof(double) * (size_t)(n ? n : 1));
  cr_assert(d && tt_tensor_to_f64(t, d) == 0);
  return d;
}

/* |t - ref| <= atol + rtol * |ref| elementwise, reporting the worst element. */
static inline void tt_test_assert_close(const tt_tensor *t, const double *ref, int64_t n,
                                        double rtol, double atol, const char *what) {
  cr_assert_eq(tt_tensor_numel(t), n, "%s: %lld elements, expected %lld", what,
               (long long)tt_tensor_numel(t), (long long)n);
  double *got = tt_test_to_f64(t);
  int64_t worst = -1;
  double worst_excess = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double err = fabs(got[i] - ref[i]), lim = atol + rtol * fabs(ref[i]);
    if (!(err <= lim) && (worst < 0 || err - lim > worst_excess || isnan(err))) {
      worst = i;
      worst_excess = err - lim;
    }
  }
  if (worst >= 0) {
    double g = got[worst];
    free(got);
    cr_assert_fail("%s: element %lld is %.9g, reference %.9g (rtol %g, atol %g)", what,
                   (long long)worst, g, ref[worst], rtol, atol);
  }
  free(got);
}

static inline void tt_test_assert_error(int status, const char *needle) {
  cr_assert_neq(status, 0, "expected an error containing '%s', got success", needle);
  cr_assert(strstr(tt_last_error(), needle) != NULL, "error '%s' does not contain '%s'",
            tt_last_error(), needle);
}

static inline int64_t tt_test_ref_out_numel(tt_test_op_fn op, tt_tensor **in, void *ctx,
                                            tt_tensor **pout) {
  cr_assert(op(in, pout, ctx) == 0, "op failed: %s", tt_last_error());
  return tt_tensor_numel(*pout);
}

static inline void tt_test_check_forward(tt_test_op_fn op, tt_test_ref_fn ref, tt_tensor **in,
                                         int n, void *ctx, double rtol, double atol) {
  double *x[16];
  tt_tensor *out = NULL;
  tt_set_grad_enabled(0);
  int64_t m = tt_test_ref_out_numel(op, in, ctx, &out);
  tt_set_grad_enabled(1);
  for (int i = 0; i < n; i++) x[i] = in[i] ? tt_test_to_f64(in[i]) : NULL;
  double *want = calloc((size_t)(m ? m : 1), sizeof(double));
  ref(x, want, ctx);
  tt_test_assert_close(out, want, m, rtol, atol, "forward");
  free(want);
  for (int i = 0; i < n; i++) free(x[i]);
  tt_tensor_release(out);
}

static inline void tt_test_check_backward(tt_test_op_fn op, tt_test_ref_fn ref,
                                          tt_tensor **in, int n, const int *check, void *ctx,
                                          double rtol, double atol) {
  uint64_t seed = 12345;
  double *x[16];
  tt_tensor *out = NULL, *w = NULL;
  for (int i = 0; i < n; i++) {
    if (!in[i] || !check[i]) continue;
    tt_zero_grad(in[i]);
    cr_assert(tt_set_requires_grad(in[i], 1) == 0, "%s", tt_last_error());
  }
  int64_t m = tt_test_ref_out_numel(op, in, ctx, &out);
  w = tt_test_rand(out->shape, out->ndim, seed);
  cr_assert(tt_backward_with(out, w) == 0, "backward failed: %s", tt_last_error());
  double *wd = tt_test_to_f64(w);
  for (int i = 0; i < n; i++) x[i] = in[i] ? tt_test_to_f64(in[i]) : NULL;
  double *y = calloc((size_t)(m ? m : 1), sizeof(double));
  const double h = 1e-6;
  for (int i = 0; i < n; i++) {
    if (!in[i] || !check[i]) continue;
    cr_assert(in[i]->grad != NULL, "input %d received no gradient", i);
    int64_t k = tt_tensor_numel(in[i]);
    double *fd = malloc(sizeof(double) * (size_t)(k ? k : 1));
    for (int64_t j = 0; j < k; j++) {
      double keep = x[i][j], plus = 0.0, minus = 0.0;
      x[i][j] = keep + h;
      ref(x, y, ctx);
      for (int64_t q = 0; q < m; q++) plus += y[q] * wd[q];
      x[i][j] = keep - h;
      ref(x, y, ctx);
      for (int64_t q = 0; q < m; q++) minus += y[q] * wd[q];
      x[i][j] = keep;
      fd[j] = (plus - minus) / (2.0 * h);
    }
    char what[64];
    snprintf(what, sizeof what, "gradient of input %d", i);
    tt_test_assert_close(in[i]->grad, fd, k, rtol, atol, what);
    free(fd);
    tt_zero_grad(in[i]);
    tt_set_requires_grad(in[i], 0);
  }
  free(y);
  free(wd);
  for (int i = 0; i < n; i++) free(x[i]);
  tt_tensor_release(w);
  tt_tensor_release(out);
}

#endif

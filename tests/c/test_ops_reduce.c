/*
** test_ops_reduce.c — sum, mean, max, softmax and reduce_to_shape against float64
** loops; backward against finite differences; first-argmax routing; errors.
*/
#include "tt_test.h"
#include "core/tt_internal.h"

/* -- Reference ----------------------------------------------------------------------- */

enum { SUM = 0, MEAN = 1, MAX = 2 };

typedef struct red_ctx {
  int kind;
  int ndim;
  int64_t shape[TT_MAX_DIMS];
  int reduced[TT_MAX_DIMS];
  int dims[TT_MAX_DIMS];
  int ndims, keepdim;
} red_ctx;

static red_ctx red_setup(int kind, const tt_tensor *x, const int *dims, int ndims,
                         int keepdim) {
  red_ctx c = {.kind = kind, .ndim = x->ndim, .ndims = ndims, .keepdim = keepdim};
  memcpy(c.shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  for (int d = 0; d < x->ndim; d++) c.reduced[d] = ndims == 0;
  for (int i = 0; i < ndims; i++) {
    c.dims[i] = dims[i];
    c.reduced[dims[i] < 0 ? dims[i] + x->ndim : dims[i]] = 1;
  }
  return c;
}

/* Output flat index (kept dims, row-major) of input multi-index idx. */
static int64_t kept_index(const red_ctx *c, const int64_t *idx) {
  int64_t f = 0;
  for (int d = 0; d < c->ndim; d++)
    if (!c->reduced[d]) f = f * c->shape[d] + idx[d];
  return f;
}

static void red_ref(double *const *in, double *out, void *vctx) {
  const red_ctx *c = vctx;
  int64_t total = 1, nout = 1, r = 1, idx[TT_MAX_DIMS];
  for (int d = 0; d < c->ndim; d++) {
    total *= c->shape[d];
    if (c->reduced[d]) r *= c->shape[d];
    else nout *= c->shape[d];
  }
  for (int64_t o = 0; o < nout; o++) out[o] = c->kind == MAX ? -INFINITY : 0.0;
  for (int64_t f = 0; f < total; f++) {
    int64_t rem = f;
    for (int d = c->ndim - 1; d >= 0; d--) {
      idx[d] = rem % c->shape[d];
      rem /= c->shape[d];
    }
    const int64_t o = kept_index(c, idx);
    if (c->kind == MAX) out[o] = in[0][f] > out[o] ? in[0][f] : out[o];
    else out[o] += in[0][f];
  }
  if (c->kind == MEAN)
    for (int64_t o = 0; o < nout; o++) out[o] /= (double)r;
}

static int red_op(tt_tensor **in, tt_tensor **out, void *vctx) {
  const red_ctx *c = vctx;
  const int *dims = c->ndims ? c->dims : NULL;
  switch (c->kind) {
    case SUM: return tt_sum(in[0], dims, c->ndims, c->keepdim, out);
    case MEAN: return tt_mean(in[0], dims, c->ndims, c->keepdim, out);
    default: return tt_max(in[0], dims, c->ndims, c->keepdim, out);
  }
}

/* Checks every kind over one dim list, forward and backward, plus the output shape. */
static void check_reduce(tt_tensor *x, const int *dims, int ndims, int keepdim) {
  static const int one[1] = {1};
  for (int kind = SUM; kind <= MAX; kind++) {
    red_ctx c = red_setup(kind, x, dims, ndims, keepdim);
    tt_tensor *o = NULL;
    cr_assert(red_op(&x, &o, &c) == 0, "%s", tt_last_error());
    int n = 0;
    for (int d = 0; d < x->ndim; d++) {
      if (c.reduced[d] && !keepdim) continue;
      cr_assert_eq(o->shape[n], c.reduced[d] ? 1 : x->shape[d], "output dim %d", n);
      n++;
    }
    cr_assert_eq(o->ndim, n);
    tt_tensor_release(o);
    tt_test_check_forward(red_op, red_ref, &x, 1, &c, 1e-5, 1e-5);
    tt_test_check_backward(red_op, red_ref, &x, 1, one, &c, 1e-4, 1e-5);
  }
}

Test(reduce, last_dim_and_all) {
  const int64_t s[3] = {3, 5, 7};
  const int last[1] = {-1};
  tt_tensor *x = tt_test_rand(s, 3, 1), *xs = tt_test_rand_strided(s, 3, 2);
  for (int keep = 0; keep < 2; keep++) {
    check_reduce(x, last, 1, keep);
    check_reduce(xs, last, 1, keep);
    check_reduce(x, NULL, 0, keep);
    check_reduce(xs, NULL, 0, keep);
  }
  tt_tensor_release(x);
  tt_tensor_release(xs);
}

Test(reduce, leading_and_middle_dims) {
  const int64_t s[4] = {3, 5, 7, 2};
  const int first[1] = {0}, mid[2] = {1, 2}, lead2[2] = {1, 0};
  tt_tensor *x = tt_test_rand(s, 4, 3), *xs = tt_test_rand_strided(s, 4, 4);
  for (int keep = 0; keep < 2; keep++) {
    check_reduce(x, first, 1, keep);
    check_reduce(xs, mid, 2, keep);
    check_reduce(x, lead2, 2, keep);
  }
  tt_tensor_release(x);
  tt_tensor_release(xs);
}

Test(reduce, non_adjacent_dims) {
  const int64_t s[4] = {3, 5, 7, 2};
  const int a[2] = {0, 2}, b[2] = {-1, 1}, c[3] = {0, 1, 3};
  tt_tensor *x = tt_test_rand(s, 4, 5), *xs = tt_test_rand_strided(s, 4, 6);
  for (int keep = 0; keep < 2; keep++) {
    check_reduce(x, a, 2, keep);
    check_reduce(xs, b, 2, keep);
    check_reduce(x, c, 3, keep);
  }
  tt_tensor_release(x);
  tt_tensor_release(xs);
}

Test(reduce, size_one_dims_between) {
  /* Reducing dims 0 and 2 around a kept size-1 dim needs no permuted copy. */
  const int64_t s[4] = {3, 1, 5, 7};
  const int d[2] = {0, 2};
  tt_tensor *x = tt_test_rand(s, 4, 7);
  check_reduce(x, d, 2, 0);
  check_reduce(x, d, 2, 1);
  tt_tensor_release(x);
}

Test(reduce, large_threaded) {
  /* Sizes past the parallel grain: full reductions, long rows and column sums. */
  const int64_t s[2] = {513, 301};
  const int d0[1] = {0}, d1[1] = {1};
  tt_tensor *x = tt_test_rand(s, 2, 8);
  for (int kind = SUM; kind <= MAX; kind++) {
    red_ctx c0 = red_setup(kind, x, d0, 1, 0), c1 = red_setup(kind, x, d1, 1, 0);
    red_ctx ca = red_setup(kind, x, NULL, 0, 0);
    tt_test_check_forward(red_op, red_ref, &x, 1, &c0, 1e-5, 1e-4);
    tt_test_check_forward(red_op, red_ref, &x, 1, &c1, 1e-5, 1e-4);
    tt_test_check_forward(red_op, red_ref, &x, 1, &ca, 1e-5, 1e-4);
  }
  tt_tensor_release(x);
}

Test(reduce, max_routes_to_first_argmax) {
  /* x (2, 3, 2) with ties; max over dims {0, 2} (not adjacent): for each middle index
  ** the gradient goes to the first maximum in row-major order of (d0, d2). */
  const double v[12] = {1, 4, 3, 3, 5, 2,    /* d0 = 0: (d1, d2) pairs */
                        4, 0, 3, 1, 5, 5};   /* d0 = 1 */
  const int64_t s[3] = {2, 3, 2};
  tt_tensor *x = NULL, *o = NULL, *w = NULL;
  cr_assert(tt_tensor_from_f64(v, s, 3, TT_F32, &x) == 0);
  cr_assert(tt_set_requires_grad(x, 1) == 0);
  const int dims[2] = {0, 2};
  cr_assert(tt_max(x, dims, 2, 0, &o) == 0, "%s", tt_last_error());
  const double want_out[3] = {4, 3, 5};
  tt_test_assert_close(o, want_out, 3, 0, 0, "max");
  const int64_t s3[1] = {3};
  const double wv[3] = {10, 20, 30};
  cr_assert(tt_tensor_from_f64(wv, s3, 1, TT_F32, &w) == 0);
  cr_assert(tt_backward_with(o, w) == 0, "%s", tt_last_error());
  /* d1 = 0: 4 at (0, 1) first; d1 = 1: 3 at (0, 0) first; d1 = 2: 5 at (0, 0) first. */
  const double want_grad[12] = {0, 10, 20, 0, 30, 0, 0, 0, 0, 0, 0, 0};
  tt_test_assert_close(x->grad, want_grad, 12, 0, 0, "max grad");
  tt_tensor_release(o);
  tt_tensor_release(w);
  tt_tensor_release(x);
}

Test(reduce, mean_and_sum_values) {
  const double v[6] = {1, 2, 3, 4, 5, 6};
  const int64_t s[2] = {2, 3};
  tt_tensor *x = NULL, *o = NULL;
  cr_assert(tt_tensor_from_f64(v, s, 2, TT_F32, &x) == 0);
  const int d0[1] = {0};
  cr_assert(tt_mean(x, d0, 1, 1, &o) == 0);
  const double want[3] = {2.5, 3.5, 4.5};
  tt_test_assert_close(o, want, 3, 0, 0, "mean");
  cr_assert(o->ndim == 2 && o->shape[0] == 1 && o->shape[1] == 3);
  tt_tensor_release(o);
  cr_assert(tt_sum(x, NULL, 0, 0, &o) == 0);
  cr_assert(o->ndim == 0 && tt_tensor_get(o, 0) == 21.0);
  tt_tensor_release(o);
  tt_tensor_release(x);
}

/* -- Softmax ------------------------------------------------------------------------- */

typedef struct sm_ctx {
  int ndim, dim;
  int64_t shape[TT_MAX_DIMS];
} sm_ctx;

static void sm_ref(double *const *in, double *out, void *vctx) {
  const sm_ctx *c = vctx;
  int64_t outer = 1, r = c->shape[c->dim], inner = 1;
  for (int d = 0; d < c->dim; d++) outer *= c->shape[d];
  for (int d = c->dim + 1; d < c->ndim; d++) inner *= c->shape[d];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      const double *x = in[0] + o * r * inner + i;
      double m = -INFINITY, s = 0.0;
      for (int64_t k = 0; k < r; k++) m = x[k * inner] > m ? x[k * inner] : m;
      for (int64_t k = 0; k < r; k++) s += exp(x[k * inner] - m);
      for (int64_t k = 0; k < r; k++)
        out[o * r * inner + k * inner + i] = exp(x[k * inner] - m) / s;
    }
}

static int sm_op(tt_tensor **in, tt_tensor **out, void *vctx) {
  const sm_ctx *c = vctx;
  return tt_softmax(in[0], c->dim - c->ndim, out);   /* negative dims on purpose */
}

Test(reduce, softmax_every_dim) {
  const int64_t s[3] = {3, 5, 7};
  static const int one[1] = {1};
  tt_tensor *x[2] = {tt_test_rand(s, 3, 10), tt_test_rand_strided(s, 3, 11)};
  for (int i = 0; i < 2; i++)
    for (int d = 0; d < 3; d++) {
      sm_ctx c = {3, d, {3, 5, 7}};
      tt_test_check_forward(sm_op, sm_ref, &x[i], 1, &c, 1e-5, 1e-6);
      tt_test_check_backward(sm_op, sm_ref, &x[i], 1, one, &c, 1e-4, 1e-5);
    }
  tt_tensor_release(x[0]);
  tt_tensor_release(x[1]);
}

Test(reduce, softmax_large_values_stable) {
  const double v[3] = {1000, 1001, 999};
  const int64_t s[1] = {3};
  tt_tensor *x = NULL, *o = NULL;
  cr_assert(tt_tensor_from_f64(v, s, 1, TT_F32, &x) == 0);
  cr_assert(tt_softmax(x, 0, &o) == 0);
  const double e1 = exp(-1.0), e2 = exp(-2.0), z = 1 + e1 + e2;
  const double want[3] = {e1 / z, 1 / z, e2 / z};
  tt_test_assert_close(o, want, 3, 1e-6, 1e-7, "softmax");
  tt_tensor_release(o);
  tt_tensor_release(x);
  /* A wide spread (the vectorised exp over its whole range, with a tail block). */
  const double w[11] = {0, -0.3, -1, -5.5, -20, -50, -86, -88, -200, 3, 2.5};
  const int64_t s11[1] = {11};
  cr_assert(tt_tensor_from_f64(w, s11, 1, TT_F32, &x) == 0);
  cr_assert(tt_softmax(x, 0, &o) == 0);
  double z11 = 0, want11[11];
  for (int i = 0; i < 11; i++) z11 += exp(w[i] - 3);
  for (int i = 0; i < 11; i++) want11[i] = exp(w[i] - 3) / z11;
  tt_test_assert_close(o, want11, 11, 2e-6, 1e-30, "softmax spread");
  tt_tensor_release(o);
  tt_tensor_release(x);
}

Test(reduce, max_propagates_nan) {
  const double v[4] = {1, NAN, 3, NAN};
  const int64_t s[1] = {4};
  tt_tensor *x = NULL, *o = NULL, *w = NULL;
  cr_assert(tt_tensor_from_f64(v, s, 1, TT_F32, &x) == 0);
  cr_assert(tt_set_requires_grad(x, 1) == 0);
  cr_assert(tt_max(x, NULL, 0, 0, &o) == 0);
  cr_assert(isnan(tt_tensor_get(o, 0)));
  cr_assert(tt_tensor_full(NULL, 0, TT_F32, TT_CPU, 1.0, &w) == 0);
  cr_assert(tt_backward_with(o, w) == 0, "%s", tt_last_error());
  const double want[4] = {0, 1, 0, 0};
  tt_test_assert_close(x->grad, want, 4, 0, 0, "grad to the first NaN");
  tt_tensor_release(o);
  tt_tensor_release(w);
  tt_tensor_release(x);
}

/* -- reduce_to_shape ----------------------------------------------------------------- */

static void check_reduce_to(tt_tensor *g, const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  double *want = calloc((size_t)n, sizeof(double));
  const int64_t total = tt_tensor_numel(g);
  int64_t idx[TT_MAX_DIMS];
  for (int64_t f = 0; f < total; f++) {
    int64_t rem = f, t = 0;
    for (int d = g->ndim - 1; d >= 0; d--) {
      idx[d] = rem % g->shape[d];
      rem /= g->shape[d];
    }
    for (int d = 0; d < ndim; d++)
      t = t * shape[d] + (shape[d] == 1 ? 0 : idx[d + g->ndim - ndim]);
    want[t] += tt_tensor_get(g, f);
  }
  tt_tensor *r = NULL;
  cr_assert(tt_reduce_to_shape(g, shape, ndim, &r) == 0, "%s", tt_last_error());
  cr_assert_eq(r->ndim, ndim);
  for (int d = 0; d < ndim; d++) cr_assert_eq(r->shape[d], shape[d]);
  tt_test_assert_close(r, want, n, 1e-5, 1e-5, "reduce_to_shape");
  tt_tensor_release(r);
  free(want);
}

Test(reduce, reduce_to_shape) {
  const int64_t s[3] = {4, 5, 6};
  tt_tensor *g = tt_test_rand(s, 3, 20), *gs = tt_test_rand_strided(s, 3, 21);
  const int64_t t1[2] = {5, 1}, t2[1] = {6}, t3[3] = {4, 1, 6}, t4[3] = {1, 5, 1};
  const int64_t t5[1] = {1}, t6[3] = {4, 5, 6};
  tt_tensor *both[2] = {g, gs};
  for (int i = 0; i < 2; i++) {
    check_reduce_to(both[i], t1, 2);
    check_reduce_to(both[i], t2, 1);
    check_reduce_to(both[i], t3, 3);
    check_reduce_to(both[i], t4, 3);
    check_reduce_to(both[i], t5, 1);
    check_reduce_to(both[i], NULL, 0);
    check_reduce_to(both[i], t6, 3);
  }
  tt_tensor *r = NULL;
  cr_assert(tt_reduce_to_shape(g, t6, 3, &r) == 0);
  cr_assert_eq(r, g, "same shape returns g itself");
  tt_tensor_release(r);
  const int64_t bad[2] = {3, 6};
  tt_test_assert_error(tt_reduce_to_shape(g, bad, 2, &r), "does not broadcast");
  tt_tensor_release(g);
  tt_tensor_release(gs);
}

/* -- Errors -------------------------------------------------------------------------- */

Test(reduce, errors) {
  const int64_t s[2] = {3, 5}, e[2] = {3, 0};
  tt_tensor *x = tt_test_rand(s, 2, 30), *i = NULL, *z = NULL, *o = NULL;
  const int bad[1] = {2}, dup[2] = {1, -1}, d1[1] = {1};
  tt_test_assert_error(tt_sum(x, bad, 1, 0, &o), "tt_sum");
  tt_test_assert_error(tt_mean(x, bad, 1, 0, &o), "out of range");
  tt_test_assert_error(tt_max(x, dup, 2, 0, &o), "twice");
  tt_test_assert_error(tt_softmax(x, 2, &o), "tt_softmax");
  cr_assert(tt_tensor_zeros(s, 2, TT_I32, TT_CPU, &i) == 0);
  tt_test_assert_error(tt_sum(i, NULL, 0, 0, &o), "tt_sum");
  tt_test_assert_error(tt_softmax(i, 0, &o), "tt_softmax");
  cr_assert(tt_tensor_zeros(e, 2, TT_F32, TT_CPU, &z) == 0);
  tt_test_assert_error(tt_max(z, d1, 1, 0, &o), "empty");
  cr_assert(tt_sum(z, d1, 1, 0, &o) == 0, "%s", tt_last_error());
  const double zero[3] = {0, 0, 0};
  tt_test_assert_close(o, zero, 3, 0, 0, "empty sum");
  tt_tensor_release(o);
  tt_tensor_release(x);
  tt_tensor_release(i);
  tt_tensor_release(z);
}

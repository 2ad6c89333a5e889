/*
** test_ops_elementwise.c — add/sub/mul/div with broadcasting, scale, add-scalar and
** axpy against float64 loops; backward against finite differences.
*/
#include "tt_test.h"

/* -- Broadcasting reference ---------------------------------------------------------- */

typedef struct bin_ctx {
  int op;                        /* 0 add, 1 sub, 2 mul, 3 div */
  int na, nb, no;
  int64_t sa[TT_MAX_DIMS], sb[TT_MAX_DIMS], so[TT_MAX_DIMS];
} bin_ctx;

static bin_ctx bin_setup(int op, const tt_tensor *a, const tt_tensor *b) {
  bin_ctx c = {.op = op, .na = a->ndim, .nb = b->ndim};
  memcpy(c.sa, a->shape, sizeof(int64_t) * (size_t)a->ndim);
  memcpy(c.sb, b->shape, sizeof(int64_t) * (size_t)b->ndim);
  c.no = a->ndim > b->ndim ? a->ndim : b->ndim;
  for (int d = 0; d < c.no; d++) {
    int ia = d - (c.no - c.na), ib = d - (c.no - c.nb);
    int64_t da = ia >= 0 ? c.sa[ia] : 1, db = ib >= 0 ? c.sb[ib] : 1;
    c.so[d] = da == 1 ? db : da;
  }
  return c;
}

/* Flat index into a tensor of shape s (n dims) of the output multi-index idx. */
static int64_t bcast_index(const int64_t *idx, int no, const int64_t *s, int n) {
  int64_t f = 0;
  for (int d = 0; d < n; d++) {
    int64_t i = s[d] == 1 ? 0 : idx[d + no - n];
    f = f * s[d] + i;
  }
  return f;
}

static void bin_ref(double *const *in, double *out, void *vctx) {
  const bin_ctx *c = vctx;
  int64_t total = 1, idx[TT_MAX_DIMS];
  for (int d = 0; d < c->no; d++) total *= c->so[d];
  for (int64_t f = 0; f < total; f++) {
    int64_t r = f;
    for (int d = c->no - 1; d >= 0; d--) {
      idx[d] = r % c->so[d];
      r /= c->so[d];
    }
    double x = in[0][bcast_index(idx, c->no, c->sa, c->na)];
    double y = in[1][bcast_index(idx, c->no, c->sb, c->nb)];
    out[f] = c->op == 0 ? x + y : c->op == 1 ? x - y : c->op == 2 ? x * y : x / y;
  }
}

static int bin_op(tt_tensor **in, tt_tensor **out, void *vctx) {
  const bin_ctx *c = vctx;
  switch (c->op) {
    case 0: return tt_add(in[0], in[1], out);
    case 1: return tt_sub(in[0], in[1], out);
    case 2: return tt_mul(in[0], in[1], out);
    default: return tt_div(in[0], in[1], out);
  }
}

/* Moves every value of t into [1, 2) (divisors away from zero). */
static void shift_positive(tt_tensor *t) {
  for (int64_t i = 0; i < tt_tensor_numel(t); i++)
    tt_tensor_set(t, i, 1.5 + 0.5 * tt_tensor_get(t, i));
}

/* Runs all four ops forward and backward on a and b. */
static void check_all_ops(tt_tensor *a, tt_tensor *b) {
  static const int both[2] = {1, 1};
  for (int op = 0; op < 4; op++) {
    if (op == 3) shift_positive(b);
    bin_ctx c = bin_setup(op, a, b);
    tt_tensor *in[2] = {a, b};
    tt_test_check_forward(bin_op, bin_ref, in, 2, &c, 1e-6, 1e-6);
    tt_test_check_backward(bin_op, bin_ref, in, 2, both, &c, 1e-4, 1e-5);
  }
}

Test(elementwise, same_shape_contiguous) {
  const int64_t s[3] = {5, 7, 3};
  tt_tensor *a = tt_test_rand(s, 3, 1), *b = tt_test_rand(s, 3, 2);
  check_all_ops(a, b);
  tt_tensor_release(a);
  tt_tensor_release(b);
}

Test(elementwise, same_shape_strided) {
  const int64_t s[3] = {3, 5, 7};
  tt_tensor *a = tt_test_rand_strided(s, 3, 3), *b = tt_test_rand(s, 3, 4);
  check_all_ops(a, b);
  check_all_ops(b, a);
  tt_tensor_release(a);
  tt_tensor_release(b);
}

Test(elementwise, broadcast_row_and_column) {
  const int64_t sa[3] = {3, 5, 7}, sb[1] = {7}, sc[3] = {3, 5, 1}, sd[2] = {5, 7};
  tt_tensor *a = tt_test_rand(sa, 3, 5), *b = tt_test_rand(sb, 1, 6);
  tt_tensor *c = tt_test_rand(sc, 3, 7), *d = tt_test_rand_strided(sd, 2, 8);
  check_all_ops(a, b);
  check_all_ops(b, a);
  check_all_ops(a, c);
  check_all_ops(d, c);
  tt_tensor_release(a);
  tt_tensor_release(b);
  tt_tensor_release(c);
  tt_tensor_release(d);
}

Test(elementwise, broadcast_both_sides_and_scalar) {
  const int64_t sa[3] = {3, 1, 7}, sb[2] = {5, 1}, sc[1] = {1}, sd[4] = {2, 1, 5, 3};
  const int64_t sf[2] = {5, 7};
  tt_tensor *a = tt_test_rand(sa, 3, 9), *b = tt_test_rand(sb, 2, 10);
  tt_tensor *f = tt_test_rand_strided(sf, 2, 19);
  tt_tensor *c = tt_test_rand(sc, 1, 11), *d = tt_test_rand(sd, 4, 12);
  tt_tensor *e = tt_test_rand(NULL, 0, 13);
  check_all_ops(a, b);
  check_all_ops(c, a);
  check_all_ops(d, b);
  check_all_ops(d, e);
  check_all_ops(e, c);
  check_all_ops(a, f);
  tt_tensor_release(f);
  tt_tensor_release(a);
  tt_tensor_release(b);
  tt_tensor_release(c);
  tt_tensor_release(d);
  tt_tensor_release(e);
}

Test(elementwise, expanded_input) {
  const int64_t s[1] = {7}, big[3] = {3, 5, 7};
  tt_tensor *row = tt_test_rand(s, 1, 14), *b = tt_test_rand(big, 3, 15), *ex = NULL;
  cr_assert(tt_expand(row, big, 3, &ex) == 0, "%s", tt_last_error());
  check_all_ops(ex, b);
  tt_tensor_release(ex);
  tt_tensor_release(row);
  tt_tensor_release(b);
}

Test(elementwise, large_parallel_broadcast) {
  /* Large enough to take the threaded path, with a row and a column broadcast. */
  const int64_t sa[2] = {301, 257}, sb[2] = {301, 1}, sr[1] = {257};
  tt_tensor *a = tt_test_rand(sa, 2, 16), *b = tt_test_rand(sb, 2, 17);
  tt_tensor *r = tt_test_rand(sr, 1, 18);
  for (int op = 0; op < 4; op++) {
    bin_ctx c = bin_setup(op, a, b), c2 = bin_setup(op, a, r);
    tt_tensor *in[2] = {a, b}, *in2[2] = {a, r};
    tt_test_check_forward(bin_op, bin_ref, in, 2, &c, 1e-6, 1e-6);
    tt_test_check_forward(bin_op, bin_ref, in2, 2, &c2, 1e-6, 1e-6);
  }
  tt_tensor_release(a);
  tt_tensor_release(b);
  tt_tensor_release(r);
}

/* -- Scale, add-scalar --------------------------------------------------------------- */

typedef struct affine_ctx {
  int scale;
  double s;
} affine_ctx;

static int affine_op(tt_tensor **in, tt_tensor **out, void *vctx) {
  const affine_ctx *c = vctx;
  return c->scale ? tt_scale(in[0], c->s, out) : tt_add_scalar(in[0], c->s, out);
}

static int64_t affine_n;
static void affine_ref(double *const *in, double *out, void *vctx) {
  const affine_ctx *c = vctx;
  for (int64_t i = 0; i < affine_n; i++) out[i] = c->scale ? in[0][i] * c->s : in[0][i] + c->s;
}

Test(elementwise, scale_and_add_scalar) {
  const int64_t s[3] = {3, 5, 7};
  static const int one[1] = {1};
  tt_tensor *x[2] = {tt_test_rand(s, 3, 20), tt_test_rand_strided(s, 3, 21)};
  affine_n = 105;
  for (int i = 0; i < 2; i++)
    for (int sc = 0; sc < 2; sc++) {
      affine_ctx c = {sc, -2.75};
      tt_test_check_forward(affine_op, affine_ref, &x[i], 1, &c, 1e-6, 1e-6);
      tt_test_check_backward(affine_op, affine_ref, &x[i], 1, one, &c, 1e-4, 1e-5);
    }
  tt_tensor_release(x[0]);
  tt_tensor_release(x[1]);
}

/* -- axpy ---------------------------------------------------------------------------- */

static void check_axpy(tt_tensor *a, const tt_tensor *b, double alpha) {
  const int64_t n = tt_tensor_numel(a);
  double *want = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) want[i] = tt_tensor_get(a, i) + alpha * tt_tensor_get(b, i);
  cr_assert(tt_axpy_(a, alpha, b) == 0, "%s", tt_last_error());
  tt_test_assert_close(a, want, n, 1e-6, 1e-6, "axpy");
  free(want);
}

Test(elementwise, axpy_strided_and_expanded) {
  const int64_t s[3] = {3, 5, 7}, col[3] = {3, 5, 1};
  tt_tensor *a = tt_test_rand(s, 3, 30), *b = tt_test_rand(s, 3, 31);
  tt_tensor *bs = tt_test_rand_strided(s, 3, 32), *c = tt_test_rand(col, 3, 33), *ce = NULL;
  tt_tensor *as = tt_test_rand_strided(s, 3, 34);
  cr_assert(tt_expand(c, s, 3, &ce) == 0, "%s", tt_last_error());
  check_axpy(a, b, 0.5);
  check_axpy(a, bs, -1.25);
  check_axpy(a, ce, 2.0);
  check_axpy(as, b, 3.0);   /* strided destination */
  const int64_t big[2] = {1001, 333};
  tt_tensor *x = tt_test_rand(big, 2, 35), *y = tt_test_rand_strided(big, 2, 36);
  check_axpy(x, y, 0.75);
  tt_tensor *rs[] = {a, b, bs, c, ce, as, x, y};
  for (int i = 0; i < 8; i++) tt_tensor_release(rs[i]);
}

/* a half: a, b of `dt` (or f32 when b32) with the values of a rand f32 tensor. */
static tt_tensor *half_of(const int64_t *shape, int ndim, int dt, uint64_t seed) {
  tt_tensor *f = tt_test_rand(shape, ndim, seed), *h = NULL;
  cr_assert(tt_tensor_empty(shape, ndim, dt, TT_CPU, &h) == 0);
  cr_assert(tt_copy_(h, f) == 0, "%s", tt_last_error());
  tt_tensor_release(f);
  return h;
}

/* bf16 / f16 destinations: the one pass over contiguous operands gives the bits of the
** passes it replaced (widen both to f32, the f32 axpy, round back), for a half or f32 b,
** so the fast path changes no result. */
Test(elementwise, axpy_half_one_pass_equals_widened_passes) {
  const int64_t s[2] = {257, 129};
  const int dts[2] = {TT_BF16, TT_F16};
  for (int d = 0; d < 2; d++)
    for (int b32 = 0; b32 < 2; b32++) {
      tt_tensor *a = half_of(s, 2, dts[d], 50 + d), *b = half_of(s, 2, b32 ? TT_F32 : dts[d], 60);
      tt_tensor *a32 = NULL, *b32t = NULL;
      cr_assert(tt_tensor_empty(s, 2, TT_F32, TT_CPU, &a32) == 0);
      cr_assert(tt_tensor_empty(s, 2, TT_F32, TT_CPU, &b32t) == 0);
      cr_assert(tt_copy_(a32, a) == 0 && tt_copy_(b32t, b) == 0);
      cr_assert(tt_axpy_(a32, -0.37, b32t) == 0, "%s", tt_last_error());
      tt_tensor *want = NULL;
      cr_assert(tt_tensor_empty(s, 2, dts[d], TT_CPU, &want) == 0);
      cr_assert(tt_copy_(want, a32) == 0);
      int64_t v0 = tt_tensor_version(a);
      cr_assert(tt_axpy_(a, -0.37, b) == 0, "%s", tt_last_error());
      cr_assert(tt_tensor_version(a) > v0, "the write did not bump the version");
      cr_assert(memcmp(tt_tensor_data(a), tt_tensor_data(want), (size_t)(257 * 129 * 2)) == 0,
                "%s, b %s: the one pass differs from the widened passes",
                tt_dtype_name(dts[d]), b32 ? "f32" : tt_dtype_name(dts[d]));
      tt_tensor *rs[] = {a, b, a32, b32t, want};
      for (int i = 0; i < 5; i++) tt_tensor_release(rs[i]);
    }
}

Test(elementwise, axpy_errors) {
  const int64_t s[2] = {3, 5}, t[2] = {5, 3};
  tt_tensor *a = tt_test_rand(s, 2, 40), *b = tt_test_rand(t, 2, 41), *i = NULL;
  tt_test_assert_error(tt_axpy_(a, 1.0, b), "tt_axpy_");
  tt_test_assert_error(tt_axpy_(a, 1.0, b), "[5, 3]");
  cr_assert(tt_tensor_zeros(s, 2, TT_I32, TT_CPU, &i) == 0);
  tt_test_assert_error(tt_axpy_(a, 1.0, i), "tt_axpy_");
  tt_tensor_release(a);
  tt_tensor_release(b);
  tt_tensor_release(i);
}

/* -- Errors -------------------------------------------------------------------------- */

Test(elementwise, bad_shapes_and_dtypes) {
  const int64_t sa[2] = {3, 5}, sb[2] = {4, 5};
  tt_tensor *a = tt_test_rand(sa, 2, 50), *b = tt_test_rand(sb, 2, 51), *i = NULL, *o = NULL;
  tt_test_assert_error(tt_add(a, b, &o), "tt_add");
  tt_test_assert_error(tt_mul(a, b, &o), "do not broadcast");
  tt_test_assert_error(tt_div(a, b, &o), "[4, 5]");
  cr_assert_null(o);
  cr_assert(tt_tensor_zeros(sa, 2, TT_I64, TT_CPU, &i) == 0);
  tt_test_assert_error(tt_sub(a, i, &o), "tt_sub");
  tt_test_assert_error(tt_scale(i, 2.0, &o), "tt_scale");
  tt_test_assert_error(tt_add_scalar(NULL, 2.0, &o), "tt_add_scalar");
  tt_tensor_release(a);
  tt_tensor_release(b);
  tt_tensor_release(i);
}

Test(elementwise, gradient_accumulates_across_uses) {
  /* y = a * a + a: dy/da = 2a + 1, the two uses of a summing into one .grad. */
  const int64_t s[2] = {3, 5};
  tt_tensor *a = tt_test_rand(s, 2, 60), *sq = NULL, *y = NULL, *w = NULL;
  cr_assert(tt_set_requires_grad(a, 1) == 0);
  cr_assert(tt_mul(a, a, &sq) == 0 && tt_add(sq, a, &y) == 0, "%s", tt_last_error());
  cr_assert(tt_tensor_full(s, 2, TT_F32, TT_CPU, 1.0, &w) == 0);
  cr_assert(tt_backward_with(y, w) == 0, "%s", tt_last_error());
  double want[15];
  for (int i = 0; i < 15; i++) want[i] = 2.0 * tt_tensor_get(a, i) + 1.0;
  tt_test_assert_close(a->grad, want, 15, 1e-6, 1e-6, "grad");
  tt_tensor_release(sq);
  tt_tensor_release(y);
  tt_tensor_release(w);
  tt_tensor_release(a);
}

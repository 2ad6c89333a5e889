/*
** test_ops_rope.c — rotary embedding against float64 loops in both conventions
** (rotate-half and interleaved), with default and explicit positions, contiguous and
** strided inputs; backward against central differences; rejected arguments.
*/
#include "tt_test.h"

typedef struct { int64_t B, T, H, Dh; double theta; int interleaved; } rope_ctx;

/* in[0]: x (B, T, H, Dh), in[1]: positions (T) or NULL.
** rotate-half: out[i] = x[i] cos - x[i + D/2] sin, out[i + D/2] = x[i + D/2] cos + x[i] sin;
** interleaved: the same on the pair (2i, 2i + 1). Angle pos * theta^(-2i / D). */
static void rope_ref(double *const *in, double *out, void *ctx) {
  rope_ctx *c = ctx;
  int64_t half = c->Dh / 2;
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t t = 0; t < c->T; t++)
      for (int64_t h = 0; h < c->H; h++) {
        int64_t base = ((b * c->T + t) * c->H + h) * c->Dh;
        const double *x = in[0] + base;
        double *y = out + base;
        double pos = in[1] ? in[1][t] : (double)t;
        for (int64_t i = 0; i < half; i++) {
          double a = pos * pow(c->theta, -2.0 * (double)i / (double)c->Dh);
          int64_t i0 = c->interleaved ? 2 * i : i, i1 = c->interleaved ? 2 * i + 1 : i + half;
          y[i0] = x[i0] * cos(a) - x[i1] * sin(a);
          y[i1] = x[i1] * cos(a) + x[i0] * sin(a);
        }
      }
}

static int rope_op(tt_tensor **in, tt_tensor **out, void *ctx) {
  rope_ctx *c = ctx;
  return tt_rope(in[0], in[1], c->theta, c->interleaved, out);
}

/* Explicit positions: out of order and large (a context-parallel chunk far into the
** sequence), so the angle table must be computed in float64. */
static tt_tensor *positions(int64_t T, int dtype) {
  tt_tensor *p = NULL;
  cr_assert(tt_tensor_empty(&T, 1, dtype, TT_CPU, &p) == 0);
  for (int64_t t = 0; t < T; t++) tt_tensor_set(p, t, (double)(4093 + 7 * ((t * 5) % T)));
  return p;
}

Test(rope, forward_both_conventions) {
  int64_t shape[4] = {2, 5, 3, 10};
  for (int variant = 0; variant < 8; variant++) {
    int interleaved = variant & 1, strided = (variant >> 1) & 1, with_pos = (variant >> 2) & 1;
    tt_tensor *in[2] = {strided ? tt_test_rand_strided(shape, 4, 10 + variant)
                                : tt_test_rand(shape, 4, 10 + variant),
                        with_pos ? positions(5, variant & 2 ? TT_I64 : TT_I32) : NULL};
    rope_ctx c = {2, 5, 3, 10, 10000.0, interleaved};
    tt_test_check_forward(rope_op, rope_ref, in, 2, &c, 1e-5, 1e-5);
    tt_tensor_release(in[0]);
    tt_tensor_release(in[1]);
  }
}

/* Enough elements for the threaded path, a Llama-3 style theta. */
Test(rope, forward_threaded) {
  int64_t shape[4] = {3, 37, 5, 66};
  for (int interleaved = 0; interleaved < 2; interleaved++) {
    tt_tensor *in[2] = {tt_test_rand(shape, 4, 3), NULL};
    rope_ctx c = {3, 37, 5, 66, 500000.0, interleaved};
    tt_test_check_forward(rope_op, rope_ref, in, 2, &c, 1e-5, 1e-5);
    tt_tensor_release(in[0]);
  }
}

Test(rope, backward_both_conventions) {
  int64_t shape[4] = {2, 3, 3, 6};
  int check[2] = {1, 0};
  for (int variant = 0; variant < 4; variant++) {
    int interleaved = variant & 1, with_pos = variant >> 1;
    tt_tensor *in[2] = {tt_test_rand_strided(shape, 4, 20 + variant),
                        with_pos ? positions(3, TT_I64) : NULL};
    rope_ctx c = {2, 3, 3, 6, 100.0, interleaved};
    tt_test_check_backward(rope_op, rope_ref, in, 2, check, &c, 1e-5, 1e-6);
    tt_tensor_release(in[0]);
    tt_tensor_release(in[1]);
  }
}

Test(rope, rejects_bad_arguments) {
  int64_t odd[4] = {1, 4, 2, 5}, three[3] = {4, 2, 6}, ok[4] = {1, 4, 2, 6}, p3[1] = {3};
  tt_tensor *xo = tt_test_rand(odd, 4, 1), *x3 = tt_test_rand(three, 3, 2);
  tt_tensor *x = tt_test_rand(ok, 4, 3), *p = tt_test_index(p3, 1, 9, TT_I32, 4);
  tt_tensor *pf = tt_test_rand(p3, 1, 5), *y = NULL;
  tt_test_assert_error(tt_rope(xo, NULL, 1e4, 0, &y), "rope: x f32[1, 4, 2, 5] cpu must be (B, T, H, Dh) with Dh even");
  tt_test_assert_error(tt_rope(x3, NULL, 1e4, 0, &y), "rope: x f32[4, 2, 6] cpu must be");
  tt_test_assert_error(tt_rope(x, p, 1e4, 1, &y), "rope: positions i32[3] cpu must be (T) = (4)");
  tt_test_assert_error(tt_rope(x, pf, 1e4, 1, &y), "rope: positions must be i32 or i64, got f32");
  tt_test_assert_error(tt_rope(x, NULL, 0.0, 0, &y), "rope: theta must be finite and > 0");
  cr_assert_null(y);
  tt_tensor_release(xo);
  tt_tensor_release(x3);
  tt_tensor_release(x);
  tt_tensor_release(p);
  tt_tensor_release(pf);
}

/* bf16 x: rotated in f32 from the bf16 values and rounded once (within one bf16 rounding
** of the float64 rotation of those values), in both conventions; the gradient too. */
Test(rope, bf16) {
  int64_t s[4] = {2, 7, 3, 10};
  for (int interleaved = 0; interleaved < 2; interleaved++) {
    tt_tensor *x32 = tt_test_rand(s, 4, 31), *x = NULL, *y = NULL, *g32 = tt_test_rand(s, 4, 32);
    tt_tensor *g = NULL, *xr = NULL, *gr = NULL;
    cr_assert(tt_tensor_empty(s, 4, TT_BF16, TT_CPU, &x) == 0 && tt_copy_(x, x32) == 0);
    cr_assert(tt_tensor_empty(s, 4, TT_BF16, TT_CPU, &g) == 0 && tt_copy_(g, g32) == 0);
    cr_assert(tt_set_requires_grad(x, 1) == 0);
    cr_assert(tt_rope(x, NULL, 1e4, interleaved, &y) == 0, "%s", tt_last_error());
    cr_assert_eq(y->dtype, TT_BF16);
    cr_assert(tt_backward_with(y, g) == 0, "%s", tt_last_error());
    cr_assert_eq(x->grad->dtype, TT_BF16);
    const int64_t n = tt_tensor_numel(x);
    double *xv = tt_test_to_f64(x), *gv = tt_test_to_f64(g);
    double *want = malloc(sizeof(double) * n), *gwant = malloc(sizeof(double) * n);
    rope_ctx c = {2, 7, 3, 10, 1e4, interleaved};
    double *in[2] = {xv, NULL};
    rope_ref(in, want, &c);
    c.theta = 1e4;
    /* the gradient: rotation by the opposite angle = the reference at negated positions */
    double *neg = malloc(sizeof(double) * 7);
    for (int t = 0; t < 7; t++) neg[t] = -(double)t;
    double *gin[2] = {gv, neg};
    rope_ref(gin, gwant, &c);
    tt_test_assert_close(y, want, n, 1.0 / 256, 1e-6, "bf16 rope");
    tt_test_assert_close(x->grad, gwant, n, 1.0 / 256, 1e-6, "bf16 rope gradient");
    free(xv);
    free(gv);
    free(want);
    free(gwant);
    free(neg);
    tt_tensor *all[] = {x32, x, y, g32, g, xr, gr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  }
}

/* tt_rope_ on a projection's output (x W^T viewed as heads), as the attention does: the
** values equal tt_rope's bitwise, in x's own memory (no new buffer), and the gradients of
** the projection's input and weight equal those through tt_rope, bitwise. */
Test(rope, in_place_matches_copy) {
  int64_t sx[2] = {2 * 5, 8}, sw[2] = {3 * 6, 8}, heads[4] = {2, 5, 3, 6};
  tt_tensor *x[2] = {tt_test_rand(sx, 2, 41), tt_test_rand(sx, 2, 41)};
  tt_tensor *w[2] = {tt_test_rand(sw, 2, 42), tt_test_rand(sw, 2, 42)};
  tt_tensor *y[2] = {NULL, NULL}, *g = tt_test_rand(heads, 4, 43);
  for (int k = 0; k < 2; k++) {   /* k 0: tt_rope, 1: tt_rope_ */
    tt_tensor *p = NULL, *h = NULL;
    cr_assert(tt_set_requires_grad(x[k], 1) == 0 && tt_set_requires_grad(w[k], 1) == 0);
    cr_assert(tt_linear(x[k], w[k], NULL, &p) == 0);
    cr_assert(tt_view(p, heads, 4, &h) == 0);
    tt_alloc_stats before, after;
    tt_alloc_stats_get(TT_CPU, &before);
    cr_assert((k ? tt_rope_(h, NULL, 1e4, 0, &y[k]) : tt_rope(h, NULL, 1e4, 0, &y[k])) == 0,
              "%s", tt_last_error());
    tt_alloc_stats_get(TT_CPU, &after);
    if (k == 1) {
      cr_assert_eq(y[1]->storage, p->storage, "rotated in place");
      cr_assert_eq(after.live_bytes - before.live_bytes,
                   (int64_t)tt_alloc_granted_bytes(2 * 5 * 3 * sizeof(float)),
                   "in place: only the angle table is new");
    }
    tt_tensor_release(h);
    tt_tensor_release(p);
  }
  const int64_t n = tt_tensor_numel(y[0]);
  cr_assert(memcmp(tt_tensor_data(y[0]), tt_tensor_data(y[1]), sizeof(float) * n) == 0);
  for (int k = 0; k < 2; k++) cr_assert(tt_backward_with(y[k], g) == 0, "%s", tt_last_error());
  cr_assert(memcmp(tt_tensor_data(x[0]->grad), tt_tensor_data(x[1]->grad),
                   sizeof(float) * tt_tensor_numel(x[0])) == 0, "grad x");
  cr_assert(memcmp(tt_tensor_data(w[0]->grad), tt_tensor_data(w[1]->grad),
                   sizeof(float) * tt_tensor_numel(w[0])) == 0, "grad w");
  tt_tensor *all[] = {x[0], x[1], w[0], w[1], y[0], y[1], g};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(rope, in_place_refusals) {
  int64_t s[4] = {1, 4, 2, 6};
  tt_tensor *leaf = tt_test_rand(s, 4, 51), *t = NULL, *y = NULL;
  cr_assert(tt_set_requires_grad(leaf, 1) == 0);
  tt_test_assert_error(tt_rope_(leaf, NULL, 1e4, 0, &y), "not a leaf that requires grad");
  tt_tensor *plain = tt_test_rand(s, 4, 52);
  cr_assert(tt_transpose(plain, 1, 2, &t) == 0);
  tt_test_assert_error(tt_rope_(t, NULL, 1e4, 0, &y), "rope_: x f32[1, 2, 4, 6]");
  cr_assert_null(y);
  tt_tensor *all[] = {leaf, t, plain};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

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

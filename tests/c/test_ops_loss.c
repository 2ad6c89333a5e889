/*
** test_ops_loss.c — fused cross-entropy against a float64 loop: forward with ignored
** targets, strided logits, large logits; backward against central differences; the
** all-ignored case (loss 0, zero gradient); threaded determinism; rejected arguments.
*/
#include "tt_test.h"

enum { IGNORE = -100 };

typedef struct { int64_t N, V, ignore; } ce_ctx;

/* in[0]: logits (N, V), in[1]: targets (N) -> mean over kept rows of lse - x[t] */
static void ce_ref(double *const *in, double *out, void *ctx) {
  ce_ctx *c = ctx;
  double total = 0.0;
  int64_t count = 0;
  for (int64_t n = 0; n < c->N; n++) {
    int64_t t = (int64_t)in[1][n];
    if (t == c->ignore) continue;
    const double *x = in[0] + n * c->V;
    double mx = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < c->V; j++) mx = x[j] > mx ? x[j] : mx;
    for (int64_t j = 0; j < c->V; j++) s += exp(x[j] - mx);
    total += mx + log(s) - x[t];
    count++;
  }
  out[0] = count ? total / (double)count : 0.0;
}

static int ce_op(tt_tensor **in, tt_tensor **out, void *ctx) {
  return tt_cross_entropy(in[0], in[1], ((ce_ctx *)ctx)->ignore, out);
}

/* targets in [0, V) with every third row set to ignore_index */
static tt_tensor *targets_with_ignored(const int64_t *shape, int ndim, int64_t V, int dtype,
                                       uint64_t seed) {
  tt_tensor *t = tt_test_index(shape, ndim, V, dtype, seed);
  for (int64_t i = 0; i < tt_tensor_numel(t); i += 3) tt_tensor_set(t, i, IGNORE);
  return t;
}

static void scale_values(tt_tensor *t, double s) {
  for (int64_t i = 0; i < tt_tensor_numel(t); i++) tt_tensor_set(t, i, s * tt_tensor_get(t, i));
}

Test(cross_entropy, forward) {
  int64_t lshape[3] = {3, 5, 37}, tshape[2] = {3, 5};
  for (int variant = 0; variant < 4; variant++) {
    int strided = variant & 1, dtype = variant & 2 ? TT_I64 : TT_I32;
    tt_tensor *in[2] = {strided ? tt_test_rand_strided(lshape, 3, 1 + variant)
                                : tt_test_rand(lshape, 3, 1 + variant),
                        targets_with_ignored(tshape, 2, 37, dtype, 9 + variant)};
    scale_values(in[0], 4.0);
    ce_ctx c = {15, 37, IGNORE};
    tt_test_check_forward(ce_op, ce_ref, in, 2, &c, 1e-5, 1e-6);
    tt_tensor_release(in[0]);
    tt_tensor_release(in[1]);
  }
}

/* Logits of a few hundred: a naive exp overflows, the max-shifted form does not. */
Test(cross_entropy, large_logits_and_masked_entries) {
  int64_t lshape[2] = {4, 9}, tshape[1] = {4};
  tt_tensor *in[2] = {tt_test_rand(lshape, 2, 3), tt_test_index(tshape, 1, 9, TT_I64, 4)};
  scale_values(in[0], 300.0);
  ce_ctx c = {4, 9, IGNORE};
  tt_test_check_forward(ce_op, ce_ref, in, 2, &c, 1e-5, 1e-4);
  /* -inf logits (masked vocabulary entries) away from the targets keep the loss finite */
  for (int64_t n = 0; n < 4; n++) {
    int64_t t = (int64_t)tt_tensor_get(in[1], n);
    tt_tensor_set(in[0], n * 9 + (t + 1) % 9, -INFINITY);
  }
  tt_tensor *y = NULL;
  cr_assert(tt_cross_entropy(in[0], in[1], IGNORE, &y) == 0);
  cr_assert(isfinite(tt_tensor_get(y, 0)));
  tt_tensor_release(y);
  tt_tensor_release(in[0]);
  tt_tensor_release(in[1]);
}

Test(cross_entropy, backward) {
  int64_t lshape[2] = {7, 11}, tshape[1] = {7};
  int check[2] = {1, 0};
  for (int strided = 0; strided < 2; strided++) {
    tt_tensor *in[2] = {strided ? tt_test_rand_strided(lshape, 2, 5) : tt_test_rand(lshape, 2, 5),
                        targets_with_ignored(tshape, 1, 11, TT_I32, 6)};
    scale_values(in[0], 3.0);
    ce_ctx c = {7, 11, IGNORE};
    tt_test_check_backward(ce_op, ce_ref, in, 2, check, &c, 1e-4, 1e-7);
    tt_tensor_release(in[0]);
    tt_tensor_release(in[1]);
  }
}

/* Every target ignored: loss exactly 0 and an all-zero gradient, never NaN. */
Test(cross_entropy, all_ignored) {
  int64_t lshape[2] = {3, 5}, tshape[1] = {3};
  tt_tensor *x = tt_test_rand(lshape, 2, 1), *t = NULL, *y = NULL;
  cr_assert(tt_tensor_full(tshape, 1, TT_I64, TT_CPU, 7, &t) == 0);
  cr_assert(tt_set_requires_grad(x, 1) == 0);
  cr_assert(tt_cross_entropy(x, t, 7, &y) == 0, "%s", tt_last_error());
  cr_assert(tt_tensor_get(y, 0) == 0.0);
  cr_assert(tt_backward(y) == 0, "%s", tt_last_error());
  double zeros[15] = {0};
  tt_test_assert_close(x->grad, zeros, 15, 0.0, 0.0, "all-ignored gradient");
  tt_tensor_release(y);
  tt_tensor_release(t);
  tt_tensor_release(x);
}

/* N x V above the grain: loss and gradient against float64 and bitwise equal for 1 and
** 2 threads. */
Test(cross_entropy, threaded_deterministic) {
  int64_t N = 61, V = 2053, lshape[2] = {N, V}, tshape[1] = {N};
  tt_tensor *x = tt_test_rand(lshape, 2, 11), *t = targets_with_ignored(tshape, 1, V, TT_I64, 12);
  scale_values(x, 8.0);
  float loss[2];
  tt_tensor *grad[2];
  int keep = tt_get_num_threads();
  for (int k = 0; k < 2; k++) {
    tt_set_num_threads(k + 1);
    tt_tensor *y = NULL;
    tt_zero_grad(x);
    cr_assert(tt_set_requires_grad(x, 1) == 0);
    cr_assert(tt_cross_entropy(x, t, IGNORE, &y) == 0, "%s", tt_last_error());
    loss[k] = (float)tt_tensor_get(y, 0);
    cr_assert(tt_backward(y) == 0, "%s", tt_last_error());
    cr_assert(tt_clone(x->grad, &grad[k]) == 0);
    tt_tensor_release(y);
  }
  tt_set_num_threads(keep);
  cr_assert(loss[0] == loss[1]);
  cr_assert(memcmp(tt_tensor_data(grad[0]), tt_tensor_data(grad[1]),
                   sizeof(float) * N * V) == 0, "gradient differs between 1 and 2 threads");
  double *xd = tt_test_to_f64(x), *td = tt_test_to_f64(t), want;
  double *in[2] = {xd, td};
  ce_ctx c = {N, V, IGNORE};
  ce_ref(in, &want, &c);
  cr_assert(fabs(loss[0] - want) <= 1e-5 * fabs(want), "loss %.9g, reference %.9g", loss[0], want);
  /* dx = (softmax - onehot) / count on kept rows */
  double *gw = calloc((size_t)(N * V), sizeof(double));
  int64_t count = 0;
  for (int64_t n = 0; n < N; n++) count += (int64_t)td[n] != IGNORE;
  for (int64_t n = 0; n < N; n++) {
    int64_t tn = (int64_t)td[n];
    if (tn == IGNORE) continue;
    double mx = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < V; j++) mx = fmax(mx, xd[n * V + j]);
    for (int64_t j = 0; j < V; j++) s += exp(xd[n * V + j] - mx);
    for (int64_t j = 0; j < V; j++) gw[n * V + j] = exp(xd[n * V + j] - mx) / s / count;
    gw[n * V + tn] -= 1.0 / count;
  }
  tt_test_assert_close(grad[1], gw, N * V, 1e-4, 1e-9, "threaded gradient");
  free(gw);
  free(xd);
  free(td);
  tt_tensor_release(grad[0]);
  tt_tensor_release(grad[1]);
  tt_tensor_release(x);
  tt_tensor_release(t);
}

Test(cross_entropy, rejects_bad_arguments) {
  int64_t lshape[2] = {4, 6}, tshape[1] = {4}, bad_t[1] = {5};
  tt_tensor *x = tt_test_rand(lshape, 2, 1), *t = tt_test_index(tshape, 1, 6, TT_I32, 2);
  tt_tensor *tb = tt_test_index(bad_t, 1, 6, TT_I32, 3), *tf = tt_test_rand(tshape, 1, 4);
  tt_tensor *y = NULL;
  tt_test_assert_error(tt_cross_entropy(x, tb, IGNORE, &y),
                       "cross_entropy: logits f32[4, 6] cpu must be (..., V) with V > 0 and "
                       "targets i32[5] cpu must be its leading dims");
  tt_test_assert_error(tt_cross_entropy(x, tf, IGNORE, &y),
                       "cross_entropy: targets must be i32 or i64, got f32");
  tt_test_assert_error(tt_cross_entropy(t, t, IGNORE, &y),
                       "cross_entropy: logits are i32; expected f32 or bf16");
  ((int32_t *)tt_tensor_data(t))[3] = 6;
  tt_test_assert_error(tt_cross_entropy(x, t, IGNORE, &y),
                       "cross_entropy: target 6 at row 3 is outside [0, 6)");
  ((int32_t *)tt_tensor_data(t))[3] = -1;
  tt_test_assert_error(tt_cross_entropy(x, t, IGNORE, &y), "target -1 at row 3");
  cr_assert_null(y);
  tt_tensor_release(x);
  tt_tensor_release(t);
  tt_tensor_release(tb);
  tt_tensor_release(tf);
}

/* bf16 logits: the loss is the f32 op's on the same (bf16) values, bitwise, and the
** gradient is the f32 op's rounded to bf16 once, with an ignored row among the others. */
Test(cross_entropy, bf16_logits) {
  int64_t ls[2] = {7, 300}, ts[1] = {7};
  tt_tensor *l32 = tt_test_rand(ls, 2, 71), *t = tt_test_index(ts, 1, 300, TT_I64, 72);
  tt_tensor_set(t, 2, (double)IGNORE);
  tt_tensor *lb = NULL, *lr = NULL, *yb = NULL, *yr = NULL;
  cr_assert(tt_tensor_empty(ls, 2, TT_BF16, TT_CPU, &lb) == 0 && tt_copy_(lb, l32) == 0);
  cr_assert(tt_tensor_empty(ls, 2, TT_F32, TT_CPU, &lr) == 0 && tt_copy_(lr, lb) == 0);
  cr_assert(tt_set_requires_grad(lb, 1) == 0 && tt_set_requires_grad(lr, 1) == 0);
  cr_assert(tt_cross_entropy(lb, t, IGNORE, &yb) == 0, "%s", tt_last_error());
  cr_assert(tt_cross_entropy(lr, t, IGNORE, &yr) == 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_get(yb, 0), tt_tensor_get(yr, 0), "bf16 loss %g, f32 loss %g",
               tt_tensor_get(yb, 0), tt_tensor_get(yr, 0));
  cr_assert(tt_backward(yb) == 0 && tt_backward(yr) == 0, "%s", tt_last_error());
  cr_assert_eq(lb->grad->dtype, TT_BF16);
  for (int64_t i = 0; i < 7 * 300; i++)
    cr_assert_eq(tt_tensor_get(lb->grad, i),
                 tt_bf16_to_float(tt_float_to_bf16((float)tt_tensor_get(lr->grad, i))),
                 "gradient element %lld", (long long)i);
  tt_tensor *all[] = {l32, t, lb, lr, yb, yr};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

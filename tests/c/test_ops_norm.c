/*
** test_ops_norm.c — RMSNorm and LayerNorm against float64 loops: forward with and without
** weight/bias on contiguous and strided inputs, backward of every input against central
** differences, threaded parameter gradients (bitwise equal across thread counts), and
** rejected arguments.
*/
#include "tt_test.h"

typedef struct { int64_t N, D; double eps; int layer; } norm_ctx;

/* in[0]: x (N, D), in[1]: weight (D) or NULL, in[2]: bias (D) or NULL (LayerNorm only) */
static void norm_ref(double *const *in, double *out, void *ctx) {
  norm_ctx *c = ctx;
  for (int64_t n = 0; n < c->N; n++) {
    const double *x = in[0] + n * c->D;
    double mu = 0.0, var = 0.0;
    if (c->layer) {
      for (int64_t j = 0; j < c->D; j++) mu += x[j];
      mu /= (double)c->D;
    }
    for (int64_t j = 0; j < c->D; j++) var += (x[j] - mu) * (x[j] - mu);
    double r = 1.0 / sqrt(var / (double)c->D + c->eps);
    for (int64_t j = 0; j < c->D; j++) {
      double v = (x[j] - mu) * r;
      if (in[1]) v *= in[1][j];
      if (c->layer && in[2]) v += in[2][j];
      out[n * c->D + j] = v;
    }
  }
}

static int norm_op(tt_tensor **in, tt_tensor **out, void *ctx) {
  norm_ctx *c = ctx;
  return c->layer ? tt_layernorm(in[0], in[1], in[2], c->eps, out)
                  : tt_rmsnorm(in[0], in[1], c->eps, out);
}

/* Runs forward and backward checks for x of `shape` with the given optional params. */
static void check_norm(int layer, const int64_t *shape, int ndim, int strided, int with_w,
                       int with_b, uint64_t seed) {
  int64_t D = shape[ndim - 1], pshape[1] = {D};
  tt_tensor *in[3] = {strided ? tt_test_rand_strided(shape, ndim, seed)
                              : tt_test_rand(shape, ndim, seed),
                      with_w ? tt_test_rand_strided(pshape, 1, seed + 1) : NULL,
                      with_b ? tt_test_rand(pshape, 1, seed + 2) : NULL};
  norm_ctx c = {tt_tensor_numel(in[0]) / D, D, 1e-5, layer};
  int check[3] = {1, with_w, with_b};
  tt_test_check_forward(norm_op, norm_ref, in, 3, &c, 1e-5, 1e-5);
  tt_test_check_backward(norm_op, norm_ref, in, 3, check, &c, 1e-4, 1e-5);
  for (int i = 0; i < 3; i++) tt_tensor_release(in[i]);
}

Test(norm, rmsnorm) {
  int64_t s3[3] = {3, 5, 13}, s2[2] = {7, 11};
  check_norm(0, s3, 3, 0, 1, 0, 10);
  check_norm(0, s3, 3, 1, 1, 0, 20);
  check_norm(0, s2, 2, 1, 0, 0, 30);
}

Test(norm, layernorm) {
  int64_t s3[3] = {3, 5, 13}, s2[2] = {7, 11};
  check_norm(1, s3, 3, 0, 1, 1, 40);
  check_norm(1, s3, 3, 1, 1, 1, 50);
  check_norm(1, s2, 2, 0, 1, 0, 60);
  check_norm(1, s2, 2, 1, 0, 1, 70);
  check_norm(1, s2, 2, 0, 0, 0, 80);
}

/* A constant row: LayerNorm's variance is 0, the output is the bias (no NaN). */
Test(norm, layernorm_constant_row) {
  int64_t shape[2] = {2, 5}, pshape[1] = {5};
  tt_tensor *x = NULL, *y = NULL;
  cr_assert(tt_tensor_full(shape, 2, TT_F32, TT_CPU, 3.25, &x) == 0);
  tt_tensor *w = tt_test_rand(pshape, 1, 1), *b = tt_test_rand(pshape, 1, 2);
  cr_assert(tt_layernorm(x, w, b, 1e-5, &y) == 0, "%s", tt_last_error());
  double want[10];
  for (int i = 0; i < 10; i++) want[i] = tt_tensor_get(b, i % 5);
  tt_test_assert_close(y, want, 10, 0.0, 1e-6, "constant rows");
  tt_tensor_release(x);
  tt_tensor_release(y);
  tt_tensor_release(w);
  tt_tensor_release(b);
}

/* Rows x D above the grain: threaded forward, dx and parameter gradients against float64
** loops, and the parameter gradients identical bit for bit with 1 and 2 threads. */
static void run_grads(int layer, tt_tensor *x, tt_tensor *w, tt_tensor *b, tt_tensor *up,
                      tt_tensor **dx, tt_tensor **dw, tt_tensor **db) {
  tt_tensor *y = NULL, *ins[3] = {x, w, b};
  for (int i = 0; i < 3; i++) {
    if (!ins[i]) continue;
    tt_zero_grad(ins[i]);
    cr_assert(tt_set_requires_grad(ins[i], 1) == 0);
  }
  cr_assert((layer ? tt_layernorm(x, w, b, 1e-5, &y) : tt_rmsnorm(x, w, 1e-5, &y)) == 0,
            "%s", tt_last_error());
  cr_assert(tt_backward_with(y, up) == 0, "%s", tt_last_error());
  cr_assert(tt_clone(x->grad, dx) == 0 && tt_clone(w->grad, dw) == 0);
  if (layer) cr_assert(tt_clone(b->grad, db) == 0);
  tt_tensor_release(y);
}

Test(norm, threaded_param_grads_deterministic) {
  int64_t N = 301, D = 131, shape[2] = {N, D}, pshape[1] = {D};
  tt_tensor *x = tt_test_rand(shape, 2, 1), *up = tt_test_rand(shape, 2, 2);
  tt_tensor *w = tt_test_rand(pshape, 1, 3), *b = tt_test_rand(pshape, 1, 4);
  double *xd = malloc(sizeof(double) * N * D), *ud = malloc(sizeof(double) * N * D);
  double *wdd = malloc(sizeof(double) * D), *want_dx = malloc(sizeof(double) * N * D);
  double *want_dw = calloc((size_t)D, sizeof(double)), *want_db = calloc((size_t)D, sizeof(double));
  tt_tensor_to_f64(x, xd);
  tt_tensor_to_f64(up, ud);
  tt_tensor_to_f64(w, wdd);
  int keep = tt_get_num_threads();
  for (int layer = 0; layer < 2; layer++) {
    tt_tensor *dx[2], *dw[2], *db[2] = {NULL, NULL};
    for (int t = 0; t < 2; t++) {
      tt_set_num_threads(t + 1);
      run_grads(layer, x, w, layer ? b : NULL, up, &dx[t], &dw[t], &db[t]);
    }
    tt_set_num_threads(keep);
    cr_assert(memcmp(tt_tensor_data(dw[0]), tt_tensor_data(dw[1]), sizeof(float) * D) == 0,
              "weight gradient differs between 1 and 2 threads");
    /* float64 analytic gradients: g = up * w, xhat = (x - mu) r,
    ** dx = r (g - mean(g) - xhat mean(g xhat)) (RMSNorm: no mean(g) term, mu = 0) */
    memset(want_dw, 0, sizeof(double) * D);
    memset(want_db, 0, sizeof(double) * D);
    for (int64_t n = 0; n < N; n++) {
      const double *xr = xd + n * D, *u = ud + n * D;
      double mu = 0.0, var = 0.0, mg = 0.0, mgx = 0.0;
      if (layer) {
        for (int64_t j = 0; j < D; j++) mu += xr[j];
        mu /= (double)D;
      }
      for (int64_t j = 0; j < D; j++) var += (xr[j] - mu) * (xr[j] - mu);
      double r = 1.0 / sqrt(var / (double)D + 1e-5);
      for (int64_t j = 0; j < D; j++) {
        double g = u[j] * wdd[j], xh = (xr[j] - mu) * r;
        if (layer) mg += g / (double)D;
        mgx += g * xh / (double)D;
        want_dw[j] += u[j] * xh;
        want_db[j] += u[j];
      }
      for (int64_t j = 0; j < D; j++)
        want_dx[n * D + j] = r * (u[j] * wdd[j] - mg - (xr[j] - mu) * r * mgx);
    }
    tt_test_assert_close(dx[1], want_dx, N * D, 1e-4, 1e-5, "dx");
    tt_test_assert_close(dw[1], want_dw, D, 1e-4, 1e-4, "dweight");
    if (layer) tt_test_assert_close(db[1], want_db, D, 1e-4, 1e-4, "dbias");
    for (int t = 0; t < 2; t++) {
      tt_tensor_release(dx[t]);
      tt_tensor_release(dw[t]);
      tt_tensor_release(db[t]);
    }
  }
  free(xd); free(ud); free(wdd); free(want_dx); free(want_dw); free(want_db);
  tt_tensor_release(x);
  tt_tensor_release(up);
  tt_tensor_release(w);
  tt_tensor_release(b);
}

Test(norm, rejects_bad_arguments) {
  int64_t xs[2] = {4, 6}, ws[1] = {5}, es[2] = {4, 0};
  tt_tensor *x = tt_test_rand(xs, 2, 1), *w = tt_test_rand(ws, 1, 2), *y = NULL;
  tt_tensor *ids = tt_test_index(xs, 2, 3, TT_I64, 3), *e = NULL;
  cr_assert(tt_tensor_empty(es, 2, TT_F32, TT_CPU, &e) == 0);
  tt_test_assert_error(tt_rmsnorm(x, w, 1e-5, &y), "rmsnorm: weight f32[5] cpu must be (6)");
  tt_test_assert_error(tt_layernorm(x, NULL, w, 1e-5, &y), "layernorm: bias f32[5] cpu must be (6)");
  tt_test_assert_error(tt_rmsnorm(ids, NULL, 1e-5, &y), "rmsnorm: x must be f32, got i64");
  tt_test_assert_error(tt_layernorm(x, ids, NULL, 1e-5, &y), "layernorm: weight must be f32");
  tt_test_assert_error(tt_rmsnorm(x, NULL, -1.0, &y), "rmsnorm: eps must be finite and >= 0");
  tt_test_assert_error(tt_rmsnorm(e, NULL, 1e-5, &y), "must have a non-empty last dim");
  cr_assert_null(y);
  tt_tensor_release(x);
  tt_tensor_release(w);
  tt_tensor_release(ids);
  tt_tensor_release(e);
}

/*
** test_ops_fused.c — the fused memory-bound ops on the CPU (kernels/cpu/fused.c, the
** twins the CUDA kernels are tested against) against float64 loops:
**   tt_add_rms_norm in f32: y and the sum y + h/2 (so that h's gradient arrives from two
**   uses, the second added in place by the norm's backward) forward, and backward of x,
**   residual and weight against central differences, on strided x, odd sizes and more
**   rows than one weight-gradient partial holds; without a residual;
**   bf16 in and out: h rounded to bf16, statistics over the rounded h, y rounded;
**   SwiGLU in bf16 against silu(g) u on the rounded inputs, and its gradients; GELU in
**   bf16 the same way;
**   tt_add_layer_norm the same way (bias too), in bf16, and against add then tt_layernorm;
**   rejected arguments name the op and the problem.
*/
#include "tt_test.h"

typedef struct { int64_t N, D; double eps; int with_res, plus_h, layer; } arn_ctx;

/* in[0]: x (N, D), in[1]: residual or NULL, in[2]: weight (D) or NULL, in[3]: bias (D)
** or NULL (LayerNorm only). out: y, or y + h / 2 with plus_h. RMSNorm, or LayerNorm
** with c->layer. */
static void arn_ref(double *const *in, double *out, void *ctx) {
  arn_ctx *c = ctx;
  for (int64_t n = 0; n < c->N; n++) {
    double h[512], mu = 0.0, ss = 0.0;
    for (int64_t j = 0; j < c->D; j++) {
      h[j] = in[0][n * c->D + j] + (in[1] ? in[1][n * c->D + j] : 0.0);
      mu += c->layer ? h[j] / (double)c->D : 0.0;
    }
    for (int64_t j = 0; j < c->D; j++) ss += (h[j] - mu) * (h[j] - mu);
    const double r = 1.0 / sqrt(ss / (double)c->D + c->eps);
    for (int64_t j = 0; j < c->D; j++) {
      double y = (h[j] - mu) * r * (in[2] ? in[2][j] : 1.0) + (in[3] ? in[3][j] : 0.0);
      out[n * c->D + j] = y + (c->plus_h ? 0.5 * h[j] : 0.0);
    }
  }
}

static int arn_op(tt_tensor **in, tt_tensor **out, void *ctx) {
  arn_ctx *c = ctx;
  tt_tensor *h = NULL, *y = NULL, *hh = NULL;
  if ((c->layer ? tt_add_layer_norm(in[0], in[1], in[2], in[3], c->eps, TT_F32, &h, &y)
                : tt_add_rms_norm(in[0], in[1], in[2], c->eps, TT_F32, &h, &y)) != 0)
    return -1;
  int rc = 0;
  if (c->plus_h) {
    rc = tt_scale(h, 0.5, &hh);
    if (rc == 0) rc = tt_add(y, hh, out);
  } else {
    tt_tensor_retain(y);
    *out = y;
  }
  tt_tensor_release(hh);
  tt_tensor_release(h);
  tt_tensor_release(y);
  return rc;
}

static void check_arn(const int64_t *shape, int ndim, int with_res, int plus_h, int layer,
                      uint64_t seed) {
  const int64_t D = shape[ndim - 1], ps[1] = {D};
  tt_tensor *in[4] = {tt_test_rand_strided(shape, ndim, seed),
                      with_res ? tt_test_rand(shape, ndim, seed + 1) : NULL,
                      tt_test_rand_strided(ps, 1, seed + 2),
                      layer ? tt_test_rand(ps, 1, seed + 3) : NULL};
  arn_ctx c = {tt_tensor_numel(in[0]) / D, D, 1e-5, with_res, plus_h, layer};
  int check[4] = {1, with_res, 1, layer};
  tt_test_check_forward(arn_op, arn_ref, in, 4, &c, 1e-5, 1e-5);
  tt_test_check_backward(arn_op, arn_ref, in, 4, check, &c, 1e-4, 1e-5);
  for (int i = 0; i < 4; i++) tt_tensor_release(in[i]);
}

/* v rounded to bf16. */
static double r16(double v) { return tt_bf16_to_float(tt_float_to_bf16((float)v)); }

static tt_tensor *to_dtype(tt_tensor *t, int dtype) {
  tt_tensor *o = NULL;
  cr_assert(tt_tensor_empty(t->shape, t->ndim, dtype, TT_CPU, &o) == 0);
  cr_assert(tt_copy_(o, t) == 0, "%s", tt_last_error());
  return o;
}

Test(fused, add_rms_norm_f32) {
  /* 150 rows: three weight-gradient partials, the last one short. */
  int64_t s3[3] = {3, 50, 13}, s2[2] = {7, 33};
  check_arn(s3, 3, 1, 0, 0, 10);
  check_arn(s3, 3, 1, 1, 0, 20);
  check_arn(s2, 2, 0, 1, 0, 30);
}

Test(fused, add_layer_norm_f32) {
  int64_t s3[3] = {3, 50, 13}, s2[2] = {7, 33};
  check_arn(s3, 3, 1, 0, 1, 40);
  check_arn(s3, 3, 1, 1, 1, 50);
  check_arn(s2, 2, 0, 1, 1, 60);
}

/* The fused LayerNorm in f32 against the unfused add then tt_layernorm (what GPT-2's
** blocks ran before): the same values and gradients to f32 rounding. */
Test(fused, add_layer_norm_matches_unfused) {
  const int64_t s[2] = {131, 24}, ps[1] = {24}, n = 131 * 24;
  tt_tensor *p[8];
  for (int k = 0; k < 2; k++) {   /* k 0: fused; 1: unfused, the same values */
    p[4 * k] = tt_test_rand(s, 2, 71);
    p[4 * k + 1] = tt_test_rand(s, 2, 72);
    p[4 * k + 2] = tt_test_rand(ps, 1, 73);
    p[4 * k + 3] = tt_test_rand(ps, 1, 74);
    for (int i = 0; i < 4; i++) cr_assert(tt_set_requires_grad(p[4 * k + i], 1) == 0);
  }
  tt_tensor *h = NULL, *y = NULL, *h1 = NULL, *y1 = NULL, *g = tt_test_rand(s, 2, 75);
  cr_assert(tt_add_layer_norm(p[0], p[1], p[2], p[3], 1e-5, TT_F32, &h, &y) == 0, "%s",
            tt_last_error());
  cr_assert(tt_add(p[4], p[5], &h1) == 0);
  cr_assert(tt_layernorm(h1, p[6], p[7], 1e-5, &y1) == 0, "%s", tt_last_error());
  double *want = tt_test_to_f64(y1);
  tt_test_assert_close(y, want, n, 1e-5, 1e-6, "fused y");
  free(want);
  cr_assert(tt_backward_with(y, g) == 0, "%s", tt_last_error());
  cr_assert(tt_backward_with(y1, g) == 0, "%s", tt_last_error());
  const char *names[4] = {"grad x", "grad residual", "grad weight", "grad bias"};
  for (int i = 0; i < 4; i++) {
    double *w = tt_test_to_f64(p[4 + i]->grad);
    tt_test_assert_close(p[i]->grad, w, tt_tensor_numel(p[i]), 1e-4, 1e-6, names[i]);
    free(w);
  }
  tt_tensor *all[] = {h, y, h1, y1, g};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  for (int i = 0; i < 8; i++) tt_tensor_release(p[i]);
}

/* bf16 in and out: h rounded to bf16, the statistics over the rounded h, y rounded. */
Test(fused, add_layer_norm_bf16) {
  const int64_t N = 70, D = 40, s[2] = {N, D}, ps[1] = {D};
  tt_tensor *x32 = tt_test_rand(s, 2, 81), *r32 = tt_test_rand(s, 2, 82);
  tt_tensor *w = tt_test_rand(ps, 1, 83), *b = tt_test_rand(ps, 1, 84);
  tt_tensor *x = to_dtype(x32, TT_BF16), *res = to_dtype(r32, TT_BF16), *h = NULL, *y = NULL;
  cr_assert(tt_add_layer_norm(x, res, w, b, 1e-5, TT_BF16, &h, &y) == 0, "%s", tt_last_error());
  cr_assert_eq(y->dtype, TT_BF16);
  double *hw = malloc(sizeof(double) * N * D), *yw = malloc(sizeof(double) * N * D);
  for (int64_t n = 0; n < N; n++) {
    double mu = 0.0, ss = 0.0;
    for (int64_t j = 0; j < D; j++) {
      const int64_t i = n * D + j;
      hw[i] = r16(tt_tensor_get(x, i) + tt_tensor_get(res, i));
      mu += hw[i] / (double)D;
    }
    for (int64_t j = 0; j < D; j++) ss += (hw[n * D + j] - mu) * (hw[n * D + j] - mu);
    const double r = 1.0 / sqrt(ss / (double)D + 1e-5);
    for (int64_t j = 0; j < D; j++)
      yw[n * D + j] = (hw[n * D + j] - mu) * r * tt_tensor_get(w, j) + tt_tensor_get(b, j);
  }
  tt_test_assert_close(h, hw, N * D, 0, 0, "h");
  tt_test_assert_close(y, yw, N * D, 1.0 / 256, 1e-5, "y");
  free(hw);
  free(yw);
  tt_tensor *all[] = {x32, r32, w, b, x, res, h, y};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(fused, add_rms_norm_bf16) {
  const int64_t N = 70, D = 40, s[2] = {N, D}, ps[1] = {D};
  tt_tensor *x32 = tt_test_rand(s, 2, 1), *r32 = tt_test_rand(s, 2, 2);
  tt_tensor *w = tt_test_rand(ps, 1, 3);
  tt_tensor *x = to_dtype(x32, TT_BF16), *res = to_dtype(r32, TT_BF16), *h = NULL, *y = NULL;
  cr_assert(tt_add_rms_norm(x, res, w, 1e-5, TT_BF16, &h, &y) == 0, "%s", tt_last_error());
  cr_assert_eq(h->dtype, TT_BF16);
  cr_assert_eq(y->dtype, TT_BF16);
  double *hw = malloc(sizeof(double) * N * D), *yw = malloc(sizeof(double) * N * D);
  for (int64_t n = 0; n < N; n++) {
    double ss = 0.0;
    for (int64_t j = 0; j < D; j++) {
      const int64_t i = n * D + j;
      hw[i] = r16(tt_tensor_get(x, i) + tt_tensor_get(res, i));
      ss += hw[i] * hw[i];
    }
    const double r = 1.0 / sqrt(ss / (double)D + 1e-5);
    for (int64_t j = 0; j < D; j++) yw[n * D + j] = hw[n * D + j] * r * tt_tensor_get(w, j);
  }
  /* h: exact (one rounding of an exact sum); y: within one bf16 rounding. */
  tt_test_assert_close(h, hw, N * D, 0, 0, "h");
  tt_test_assert_close(y, yw, N * D, 1.0 / 256, 1e-6, "y");
  free(hw);
  free(yw);
  tt_tensor *all[] = {x32, r32, w, x, res, h, y};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(fused, add_rms_norm_bf16_backward) {
  /* bf16 x, residual and y: the gradients of x and residual (bf16) are one rounding of
  ** the f32 gradient of the norm at the rounded h, with the rounded output gradient. */
  const int64_t s[2] = {67, 24}, ps[1] = {24};
  tt_tensor *x32 = tt_test_rand(s, 2, 5), *r32 = tt_test_rand(s, 2, 6), *w = tt_test_rand(ps, 1, 7);
  tt_tensor *x = to_dtype(x32, TT_BF16), *res = to_dtype(r32, TT_BF16);
  tt_tensor *g32 = tt_test_rand(s, 2, 8), *g = to_dtype(g32, TT_BF16), *gr = to_dtype(g, TT_F32);
  cr_assert(tt_set_requires_grad(x, 1) == 0);
  cr_assert(tt_set_requires_grad(res, 1) == 0);
  tt_tensor *h = NULL, *y = NULL, *h2 = NULL, *y2 = NULL;
  cr_assert(tt_add_rms_norm(x, res, w, 1e-5, TT_BF16, &h, &y) == 0, "%s", tt_last_error());
  cr_assert(tt_backward_with(y, g) == 0, "%s", tt_last_error());
  tt_tensor *hr = to_dtype(h, TT_F32);
  cr_assert(tt_set_requires_grad(hr, 1) == 0);
  cr_assert(tt_add_rms_norm(hr, NULL, w, 1e-5, TT_F32, &h2, &y2) == 0, "%s", tt_last_error());
  cr_assert(tt_backward_with(y2, gr) == 0, "%s", tt_last_error());
  cr_assert_eq(x->grad->dtype, TT_BF16);
  double *want = tt_test_to_f64(hr->grad);
  tt_test_assert_close(x->grad, want, 67 * 24, 1.0 / 256, 1e-6, "grad x (bf16)");
  tt_test_assert_close(res->grad, want, 67 * 24, 1.0 / 256, 1e-6, "grad residual (bf16)");
  free(want);
  tt_tensor *all[] = {x32, r32, w, x, res, g32, g, gr, h, y, hr, h2, y2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(fused, swiglu_bf16) {
  const int64_t s[2] = {9, 37}, n = 9 * 37;
  tt_tensor *g32 = tt_test_rand(s, 2, 11), *u32 = tt_test_rand(s, 2, 12);
  tt_tensor *gate = to_dtype(g32, TT_BF16), *up = to_dtype(u32, TT_BF16), *y = NULL;
  cr_assert(tt_set_requires_grad(gate, 1) == 0);
  cr_assert(tt_set_requires_grad(up, 1) == 0);
  cr_assert(tt_swiglu(gate, up, &y) == 0, "%s", tt_last_error());
  cr_assert_eq(y->dtype, TT_BF16);
  tt_tensor *d32 = tt_test_rand(s, 2, 13), *dy = to_dtype(d32, TT_BF16);
  cr_assert(tt_backward_with(y, dy) == 0, "%s", tt_last_error());
  double *yw = malloc(sizeof(double) * n), *dg = malloc(sizeof(double) * n);
  double *du = malloc(sizeof(double) * n);
  for (int64_t i = 0; i < n; i++) {
    const double gv = tt_tensor_get(gate, i), uv = tt_tensor_get(up, i);
    const double d = tt_tensor_get(dy, i), sg = 1.0 / (1.0 + exp(-gv));
    yw[i] = gv * sg * uv;
    dg[i] = d * uv * sg * (1.0 + gv * (1.0 - sg));
    du[i] = d * gv * sg;
  }
  tt_test_assert_close(y, yw, n, 1.0 / 256, 1e-6, "swiglu bf16");
  tt_test_assert_close(gate->grad, dg, n, 1.0 / 256, 1e-6, "swiglu bf16 grad gate");
  tt_test_assert_close(up->grad, du, n, 1.0 / 256, 1e-6, "swiglu bf16 grad up");
  free(yw);
  free(dg);
  free(du);
  tt_tensor *all[] = {g32, u32, gate, up, y, d32, dy};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

/* bf16 GELU (the fused kernel) against x sigmoid(2u) in float64 on the rounded inputs,
** and its gradient; the f32 op (the activation family's kernel) on the same values agrees
** to bf16 rounding. */
Test(fused, gelu_bf16) {
  const int64_t s[2] = {11, 37}, n = 11 * 37;
  const double K = 0.7978845608028654, Cc = 0.044715;
  tt_tensor *x32 = tt_test_rand(s, 2, 91), *x = to_dtype(x32, TT_BF16), *y = NULL, *y32 = NULL;
  cr_assert(tt_set_requires_grad(x, 1) == 0);
  cr_assert(tt_gelu(x, &y) == 0, "%s", tt_last_error());
  cr_assert_eq(y->dtype, TT_BF16);
  tt_tensor *d32 = tt_test_rand(s, 2, 92), *dy = to_dtype(d32, TT_BF16);
  cr_assert(tt_backward_with(y, dy) == 0, "%s", tt_last_error());
  cr_assert_eq(x->grad->dtype, TT_BF16);
  double *yw = malloc(sizeof(double) * n), *dw = malloc(sizeof(double) * n);
  for (int64_t i = 0; i < n; i++) {
    const double v = tt_tensor_get(x, i), d = tt_tensor_get(dy, i);
    const double sg = 1.0 / (1.0 + exp(-2.0 * K * (v + Cc * v * v * v)));
    yw[i] = v * sg;
    dw[i] = d * (sg + 2.0 * v * sg * (1.0 - sg) * K * (1.0 + 3.0 * Cc * v * v));
  }
  tt_test_assert_close(y, yw, n, 1.0 / 256, 1e-6, "gelu bf16");
  tt_test_assert_close(x->grad, dw, n, 1.0 / 256, 1e-6, "gelu bf16 grad");
  tt_tensor *xr = to_dtype(x, TT_F32);
  cr_assert(tt_gelu(xr, &y32) == 0, "%s", tt_last_error());
  tt_test_assert_close(y32, yw, n, 1e-5, 1e-7, "gelu f32 on the same values");
  free(yw);
  free(dw);
  tt_tensor *all[] = {x32, x, y, d32, dy, xr, y32};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(fused, errors) {
  const int64_t s[2] = {3, 4}, s5[2] = {3, 5}, ps[1] = {5};
  tt_tensor *x = tt_test_rand(s, 2, 1), *r = tt_test_rand(s5, 2, 2), *w = tt_test_rand(ps, 1, 3);
  tt_tensor *h = NULL, *y = NULL;
  tt_test_assert_error(tt_add_rms_norm(x, r, NULL, 1e-5, TT_F32, &h, &y), "must match x");
  tt_test_assert_error(tt_add_rms_norm(x, NULL, w, 1e-5, TT_F32, &h, &y), "weight");
  tt_test_assert_error(tt_add_rms_norm(x, NULL, NULL, 1e-5, TT_F16, &h, &y),
                       "y dtype f16; expected f32 or bf16");
  tt_test_assert_error(tt_add_layer_norm(x, NULL, NULL, w, 1e-5, TT_F32, &h, &y),
                       "add_layer_norm: bias");
  tt_tensor *xb = to_dtype(x, TT_BF16), *o = NULL;
  tt_test_assert_error(tt_swiglu(xb, x, &o), "expected both f32 or both bf16");
  tt_test_assert_error(tt_silu(xb, &o), "silu");
  tt_tensor *all[] = {x, r, w, xb};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

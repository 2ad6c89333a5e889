/*
** test_fused.c — the fused memory-bound CUDA kernels (kernels/cuda/fused.cu) against
** their CPU twins (kernels/cpu/fused.c), through the ops:
**   tt_add_rms_norm and tt_add_layer_norm (bias too) forward and backward, f32 -> f32, f32 -> bf16 (the cast into a bf16
**   GEMM) and bf16 -> bf16, at D = 4096, 1024 and 1000 (multiples of 8: the 128-bit path)
**   and 77 (odd: the scalar path only), on strided x (a transpose) and with more rows than
**   one weight-gradient partial; h's gradient arriving from a second use first (the
**   kernel adds the norm's part into it); the weight gradient bitwise equal across two
**   runs (no atomics); bf16 SwiGLU forward and backward at an odd element count (vector
**   groups and a tail) and at a misaligned start (scalar path); bf16 GELU the same way;
**   bf16 RoPE (with its gradient) and RoPE in place; the embedding's bf16 rows;
**   cross-entropy on bf16 logits.
** Tolerances: f32 outputs 1e-5 relative L2 (the order of the row sums differs); a bf16
** output may differ from the twin by one bf16 rounding where the f32 values straddle a
** rounding boundary: 8e-3.
** Without a GPU the program exits 77 before running anything.
*/
#include "cuda_test.h"

static tt_tensor *as_dtype(tt_tensor *t, int dtype, int device) {
  tt_tensor *o = NULL;
  cr_assert_eq(tt_tensor_empty(t->shape, t->ndim, dtype, device, &o), 0, "%s", tt_last_error());
  if (device == t->device) {
    cr_assert_eq(tt_copy_(o, t), 0, "%s", tt_last_error());
    return o;
  }
  tt_tensor *c = NULL, *m = NULL;
  cr_assert_eq(tt_contiguous_nograd(t, &c), 0);
  cr_assert_eq(tt_to_device(c, device, &m), 0, "%s", tt_last_error());
  cr_assert_eq(tt_copy_(o, m), 0, "%s", tt_last_error());
  tt_tensor_release(c);
  tt_tensor_release(m);
  return o;
}

/* h = x + res (returned) and y = rmsnorm(h) * w, or layernorm(h) * w + b when b is given
** (in *y_out), checked to succeed. */
static tt_tensor *run_arn(tt_tensor *x, tt_tensor *res, tt_tensor *w, tt_tensor *b,
                          int y_dtype, tt_tensor **y_out) {
  tt_tensor *h = NULL, *y = NULL;
  cr_assert_eq(b ? tt_add_layer_norm(x, res, w, b, 1e-5, y_dtype, &h, &y)
                 : tt_add_rms_norm(x, res, w, 1e-5, y_dtype, &h, &y),
               0, "%s", tt_last_error());
  *y_out = y;
  return h;
}

/* layer: LayerNorm with a bias (else RMSNorm). */
static void check_arn(int64_t N, int64_t D, int dtype, int y_dtype, int strided, int layer) {
  const int64_t s[2] = {N, D}, st[2] = {D, N}, ps[1] = {D};
  tt_tensor *x0 = randn(strided ? st : s, 2, 1.0), *r0 = randn(s, 2, 1.0), *w0 = randn(ps, 1, 0.5);
  tt_tensor *b0 = randn(ps, 1, 0.5);
  tt_tensor *bc = layer ? as_dtype(b0, TT_F32, TT_CPU) : NULL;
  tt_tensor *bg = layer ? as_dtype(b0, TT_F32, GPU) : NULL;
  if (layer) {
    cr_assert_eq(tt_set_requires_grad(bc, 1), 0);
    cr_assert_eq(tt_set_requires_grad(bg, 1), 0);
  }
  /* CPU and GPU leaves holding the same values in dtype; x passed as a transposed view
  ** of its leaf when strided. */
  tt_tensor *xc = as_dtype(x0, dtype, TT_CPU), *rc = as_dtype(r0, dtype, TT_CPU);
  tt_tensor *xg = as_dtype(x0, dtype, GPU), *rg = as_dtype(r0, dtype, GPU);
  tt_tensor *wc = as_dtype(w0, TT_F32, TT_CPU), *wg = as_dtype(w0, TT_F32, GPU);
  tt_tensor *leaves[6] = {xc, rc, wc, xg, rg, wg};
  for (int i = 0; i < 6; i++) cr_assert_eq(tt_set_requires_grad(leaves[i], 1), 0);
  tt_tensor *xcv = NULL, *xgv = NULL;
  if (strided) {
    cr_assert_eq(tt_transpose(xc, 0, 1, &xcv), 0);
    cr_assert_eq(tt_transpose(xg, 0, 1, &xgv), 0);
  } else {
    tt_tensor_retain(xc);
    tt_tensor_retain(xg);
    xcv = xc;
    xgv = xg;
  }
  tt_tensor *yc = NULL, *yg = NULL;
  tt_tensor *hc = run_arn(xcv, rc, wc, bc, y_dtype, &yc);
  for (int i = 0; i < 3; i++) poison(N * D);
  tt_tensor *hg = run_arn(xgv, rg, wg, bg, y_dtype, &yg);
  const double tol_h = dtype == TT_F32 ? 1e-6 : 0.0, tol_y = y_dtype == TT_F32 ? 1e-5 : 8e-3;
  double eh = rel_err(hg, hc), ey = rel_err(yg, yc);
  cr_assert(eh <= tol_h, "N %lld D %lld: h relative error %g", (long long)N, (long long)D, eh);
  cr_assert(ey <= tol_y, "N %lld D %lld: y relative error %g", (long long)N, (long long)D, ey);
  /* h's gradient from two uses: the rest of the residual stream's part (q) is there
  ** first, as in a transformer's backward, and the norm's backward adds into it. */
  tt_tensor *g0 = randn(s, 2, 1.0), *q0 = randn(s, 2, 1.0);
  tt_tensor *gc = as_dtype(g0, y_dtype, TT_CPU), *gg = as_dtype(g0, y_dtype, GPU);
  tt_tensor *qc = as_dtype(q0, dtype, TT_CPU), *qg = as_dtype(q0, dtype, GPU);
  cr_assert_eq(tt_accumulate_grad(hc, qc), 0, "%s", tt_last_error());
  cr_assert_eq(tt_accumulate_grad(hg, qg), 0, "%s", tt_last_error());
  cr_assert_eq(tt_backward_with(yc, gc), 0, "%s", tt_last_error());
  for (int i = 0; i < 3; i++) poison(N * D);
  cr_assert_eq(tt_backward_with(yg, gg), 0, "%s", tt_last_error());
  const double tol_g = dtype == TT_F32 ? 1e-5 : 8e-3;
  double ex = rel_err(xg->grad, xc->grad), er = rel_err(rg->grad, rc->grad);
  double ew = rel_err(wg->grad, wc->grad);
  cr_assert(ex <= tol_g && er <= tol_g, "N %lld D %lld: grad x %g, grad residual %g",
            (long long)N, (long long)D, ex, er);
  cr_assert(ew <= 1e-4, "N %lld D %lld: grad weight %g", (long long)N, (long long)D, ew);
  if (layer) {
    double eb = rel_err(bg->grad, bc->grad);
    cr_assert(eb <= 1e-4, "N %lld D %lld: grad bias %g", (long long)N, (long long)D, eb);
  }
  tt_tensor *all[] = {x0, r0, w0, b0, bc, bg, xc, rc, xg, rg, wc, wg, xcv, xgv, yc, yg, hc, hg,
                      g0, gc, gg, q0, qc, qg};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(cuda_fused, add_rms_norm_f32) {
  check_arn(130, 4096, TT_F32, TT_F32, 0, 0);
  check_arn(67, 1000, TT_F32, TT_F32, 1, 0);
  check_arn(65, 77, TT_F32, TT_F32, 0, 0);
}

Test(cuda_fused, add_rms_norm_cast_to_bf16) {
  check_arn(130, 1024, TT_F32, TT_BF16, 0, 0);
  check_arn(33, 77, TT_F32, TT_BF16, 1, 0);
}

Test(cuda_fused, add_rms_norm_bf16) {
  check_arn(130, 4096, TT_BF16, TT_BF16, 0, 0);
  check_arn(67, 1000, TT_BF16, TT_BF16, 1, 0);
  check_arn(65, 77, TT_BF16, TT_BF16, 0, 0);
}

Test(cuda_fused, add_layer_norm) {
  check_arn(130, 4096, TT_F32, TT_F32, 0, 1);
  check_arn(67, 1000, TT_F32, TT_F32, 1, 1);
  check_arn(65, 77, TT_F32, TT_F32, 0, 1);
  check_arn(130, 768, TT_F32, TT_BF16, 0, 1);
  check_arn(130, 1024, TT_BF16, TT_BF16, 0, 1);
  check_arn(65, 77, TT_BF16, TT_BF16, 1, 1);
}

Test(cuda_fused, weight_gradient_is_deterministic) {
  const int64_t s[2] = {1000, 512}, ps[1] = {512};
  tt_tensor *x = randn(s, 2, 1.0), *w = randn(ps, 1, 0.5), *g = randn(s, 2, 1.0);
  tt_tensor *xg = to_dev(x, GPU), *wg = to_dev(w, GPU), *gg = to_dev(g, GPU), *first = NULL;
  cr_assert_eq(tt_set_requires_grad(wg, 1), 0);
  for (int rep = 0; rep < 2; rep++) {
    tt_tensor *h = NULL, *y = NULL;
    cr_assert_eq(tt_add_rms_norm(xg, NULL, wg, 1e-5, TT_F32, &h, &y), 0, "%s", tt_last_error());
    cr_assert_eq(tt_backward_with(y, gg), 0, "%s", tt_last_error());
    tt_tensor *dw = to_dev(wg->grad, TT_CPU);
    if (rep == 0) {
      first = dw;
    } else {
      for (int64_t j = 0; j < 512; j++)
        cr_assert(tt_tensor_get(dw, j) == tt_tensor_get(first, j), "dw[%lld] differs between runs",
                  (long long)j);
      tt_tensor_release(dw);
    }
    tt_zero_grad(wg);
    tt_tensor_release(h);
    tt_tensor_release(y);
  }
  tt_tensor *all[] = {x, w, g, xg, wg, gg, first};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

/* SwiGLU in bf16 on n elements starting `skip` elements into their buffers (skip 1: the
** rows are not 16-byte aligned, the scalar path). */
static void check_swiglu(int64_t n, int64_t skip) {
  const int64_t total = n + skip;
  tt_tensor *g0 = randn(&total, 1, 2.0), *u0 = randn(&total, 1, 1.0), *d0 = randn(&total, 1, 1.0);
  tt_tensor *in_c[3], *in_g[3];
  tt_tensor *src[3] = {g0, u0, d0};
  for (int i = 0; i < 3; i++) {
    tt_tensor *bc = as_dtype(src[i], TT_BF16, TT_CPU), *bg = as_dtype(src[i], TT_BF16, GPU);
    cr_assert_eq(tt_narrow(bc, 0, skip, n, &in_c[i]), 0);
    cr_assert_eq(tt_narrow(bg, 0, skip, n, &in_g[i]), 0);
    tt_tensor_release(bc);
    tt_tensor_release(bg);
  }
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(tt_set_requires_grad(in_c[i], 1), 0, "%s", tt_last_error());
    cr_assert_eq(tt_set_requires_grad(in_g[i], 1), 0, "%s", tt_last_error());
  }
  tt_tensor *yc = NULL, *yg = NULL;
  cr_assert_eq(tt_swiglu(in_c[0], in_c[1], &yc), 0, "%s", tt_last_error());
  for (int i = 0; i < 3; i++) poison(n);
  cr_assert_eq(tt_swiglu(in_g[0], in_g[1], &yg), 0, "%s", tt_last_error());
  double e = rel_err(yg, yc);
  cr_assert(e <= 8e-3, "swiglu n %lld skip %lld: relative error %g", (long long)n,
            (long long)skip, e);
  cr_assert_eq(tt_backward_with(yc, in_c[2]), 0, "%s", tt_last_error());
  cr_assert_eq(tt_backward_with(yg, in_g[2]), 0, "%s", tt_last_error());
  double eg = rel_err(in_g[0]->grad, in_c[0]->grad), eu = rel_err(in_g[1]->grad, in_c[1]->grad);
  cr_assert(eg <= 8e-3 && eu <= 8e-3, "swiglu backward: grad gate %g, grad up %g", eg, eu);
  tt_tensor *all[] = {g0, u0, d0, in_c[0], in_c[1], in_c[2], in_g[0], in_g[1], in_g[2], yc, yg};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(cuda_fused, swiglu_bf16) {
  check_swiglu(100003, 0);
  check_swiglu(4099, 1);
}

/* GELU in bf16 on n elements starting `skip` elements in (skip 1: the scalar path). */
static void check_gelu(int64_t n, int64_t skip) {
  const int64_t total = n + skip;
  tt_tensor *x0 = randn(&total, 1, 2.0), *d0 = randn(&total, 1, 1.0);
  tt_tensor *xb[2], *db[2], *x[2], *d[2], *y[2];
  const int dev[2] = {TT_CPU, GPU};
  for (int i = 0; i < 2; i++) {
    xb[i] = as_dtype(x0, TT_BF16, dev[i]);
    db[i] = as_dtype(d0, TT_BF16, dev[i]);
    cr_assert_eq(tt_narrow(xb[i], 0, skip, n, &x[i]), 0);
    cr_assert_eq(tt_narrow(db[i], 0, skip, n, &d[i]), 0);
    cr_assert_eq(tt_set_requires_grad(xb[i], 1), 0, "%s", tt_last_error());
  }
  for (int i = 0; i < 2; i++) {
    tt_tensor_release(x[i]);
    cr_assert_eq(tt_narrow(xb[i], 0, skip, n, &x[i]), 0);
    if (i == 1) for (int k = 0; k < 3; k++) poison(n);
    cr_assert_eq(tt_gelu(x[i], &y[i]), 0, "%s", tt_last_error());
    cr_assert_eq(tt_backward_with(y[i], d[i]), 0, "%s", tt_last_error());
  }
  double e = rel_err(y[1], y[0]), eg = rel_err(xb[1]->grad, xb[0]->grad);
  cr_assert(e <= 8e-3 && eg <= 8e-3, "gelu n %lld skip %lld: y %g, grad %g", (long long)n,
            (long long)skip, e, eg);
  tt_tensor *all[] = {x0, d0, xb[0], xb[1], db[0], db[1], x[0], x[1], d[0], d[1], y[0], y[1]};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(cuda_fused, gelu_bf16) {
  check_gelu(100003, 0);
  check_gelu(4099, 1);
}

/* RoPE in bf16 (tt_rope with its gradient, and tt_rope_ in place) against the CPU twin. */
static void check_rope(int interleaved) {
  const int64_t s[4] = {2, 23, 3, 34};
  tt_tensor *x0 = randn(s, 4, 1.0), *g0 = randn(s, 4, 1.0);
  tt_tensor *x[2] = {as_dtype(x0, TT_BF16, TT_CPU), as_dtype(x0, TT_BF16, GPU)};
  tt_tensor *g[2] = {as_dtype(g0, TT_BF16, TT_CPU), as_dtype(g0, TT_BF16, GPU)};
  tt_tensor *y[2] = {NULL, NULL}, *z[2] = {NULL, NULL};
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(tt_set_requires_grad(x[i], 1), 0);
    if (i == 1) for (int k = 0; k < 3; k++) poison(2 * 23 * 3 * 34);
    cr_assert_eq(tt_rope(x[i], NULL, 1e4, interleaved, &y[i]), 0, "%s", tt_last_error());
    cr_assert_eq(tt_backward_with(y[i], g[i]), 0, "%s", tt_last_error());
    cr_assert_eq(tt_rope_(g[i], NULL, 1e4, interleaved, &z[i]), 0, "%s", tt_last_error());
    cr_assert(z[i]->storage == g[i]->storage, "rope_ rotates in place");
  }
  double ey = rel_err(y[1], y[0]), eg = rel_err(x[1]->grad, x[0]->grad), ez = rel_err(z[1], z[0]);
  cr_assert(ey <= 8e-3 && eg <= 8e-3 && ez <= 8e-3,
            "rope bf16 (interleaved %d): y %g, grad %g, in place %g", interleaved, ey, eg, ez);
  tt_tensor *all[] = {x0, g0, x[0], x[1], g[0], g[1], y[0], y[1], z[0], z[1]};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(cuda_fused, rope_bf16_and_in_place) {
  check_rope(0);
  check_rope(1);
}

/* The embedding with bf16 rows (tt_embedding_ex) and a bf16 gradient against the CPU twin:
** the rows exactly (one rounding of the same f32 values), the f32 table's gradient to f32
** rounding (the same sums in the same token order). */
Test(cuda_fused, embedding_bf16_rows) {
  const int64_t ws[2] = {1000, 77}, is[1] = {300}, gs[2] = {300, 77};
  tt_tensor *w0 = randn(ws, 2, 1.0), *g0 = randn(gs, 2, 1.0), *ids0 = NULL;
  cr_assert_eq(tt_tensor_empty(is, 1, TT_I64, TT_CPU, &ids0), 0);
  for (int64_t i = 0; i < 300; i++) tt_tensor_set(ids0, i, (double)((i * 37) % 1000 / 3));
  const int dev[2] = {TT_CPU, GPU};
  tt_tensor *w[2], *ids[2], *g[2], *y[2];
  for (int i = 0; i < 2; i++) {
    w[i] = as_dtype(w0, TT_F32, dev[i]);
    g[i] = as_dtype(g0, TT_BF16, dev[i]);
    cr_assert_eq(tt_to_device(ids0, dev[i], &ids[i]), 0, "%s", tt_last_error());
    cr_assert_eq(tt_set_requires_grad(w[i], 1), 0);
    if (i == 1) for (int k = 0; k < 3; k++) poison(300 * 77);
    cr_assert_eq(tt_embedding_ex(w[i], ids[i], TT_BF16, &y[i]), 0, "%s", tt_last_error());
    cr_assert_eq(tt_backward_with(y[i], g[i]), 0, "%s", tt_last_error());
  }
  double ey = rel_err(y[1], y[0]), eg = rel_err(w[1]->grad, w[0]->grad);
  cr_assert(ey == 0.0 && eg <= 1e-6, "embedding bf16 rows: y %g, grad %g", ey, eg);
  tt_tensor *all[] = {w0, g0, ids0, w[0], w[1], ids[0], ids[1], g[0], g[1], y[0], y[1]};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

/* Cross-entropy on bf16 logits (with an ignored row) against the CPU twin: the loss to f32
** rounding (the sums run in another order), the bf16 gradient within one rounding. */
Test(cuda_fused, cross_entropy_bf16_logits) {
  const int64_t ls[2] = {65, 50257}, ts[1] = {65};
  tt_tensor *l0 = randn(ls, 2, 2.0), *t0 = NULL;
  cr_assert_eq(tt_tensor_empty(ts, 1, TT_I64, TT_CPU, &t0), 0);
  for (int64_t i = 0; i < 65; i++)
    tt_tensor_set(t0, i, i == 7 ? -100.0 : (double)(i * 773 % 50257));
  const int dev[2] = {TT_CPU, GPU};
  tt_tensor *l[2], *t[2], *y[2];
  for (int i = 0; i < 2; i++) {
    l[i] = as_dtype(l0, TT_BF16, dev[i]);
    cr_assert_eq(tt_to_device(t0, dev[i], &t[i]), 0, "%s", tt_last_error());
    cr_assert_eq(tt_set_requires_grad(l[i], 1), 0);
    cr_assert_eq(tt_cross_entropy(l[i], t[i], -100, &y[i]), 0, "%s", tt_last_error());
    cr_assert_eq(tt_backward(y[i]), 0, "%s", tt_last_error());
  }
  double ey = rel_err(y[1], y[0]), eg = rel_err(l[1]->grad, l[0]->grad);
  cr_assert(ey <= 1e-5 && eg <= 8e-3, "cross-entropy bf16 logits: loss %g, grad %g", ey, eg);
  tt_tensor *all[] = {l0, t0, l[0], l[1], t[0], t[1], y[0], y[1]};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

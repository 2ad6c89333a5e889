/*
** ops_norm.c — tt_rmsnorm and tt_layernorm over the last dim of x (..., D), with optional
** weight and bias (D). The forward keeps per-row statistics (rstd, and the mean for
** LayerNorm) in a small f32 tensor saved for the backward, so the backward does not
** recompute the row reductions.
*/
#include "core/tt_internal.h"
#include "norm.h"
#include <math.h>

/* Checks x (f32, at least 1-D, D > 0) and an optional per-feature parameter (f32, (D)). */
static int check_norm_args(const char *op, tt_tensor *x, tt_tensor *weight, tt_tensor *bias,
                           double eps) {
  char a[96], b[96];
  TT_TRY(tt_check_dtype(op, "x", x, TT_F32));
  if (x->ndim < 1 || x->shape[x->ndim - 1] < 1)
    return tt_set_error("%s: x %s must have a non-empty last dim", op,
                        tt_tensor_describe(x, a, sizeof a));
  if (!(eps >= 0.0) || !isfinite(eps))
    return tt_set_error("%s: eps must be finite and >= 0 (got %g)", op, eps);
  int64_t D = x->shape[x->ndim - 1];
  tt_tensor *params[2] = {weight, bias};
  const char *names[2] = {"weight", "bias"};
  for (int i = 0; i < 2; i++) {
    tt_tensor *p = params[i];
    if (!p) continue;
    TT_TRY(tt_check_dtype(op, names[i], p, TT_F32));
    if (p->ndim != 1 || p->shape[0] != D)
      return tt_set_error("%s: %s %s must be (%lld) to match x %s", op, names[i],
                          tt_tensor_describe(p, a, sizeof a), (long long)D,
                          tt_tensor_describe(x, b, sizeof b));
    tt_tensor *pair[2] = {x, p};
    TT_TRY(tt_check_same_device(op, pair, 2));
  }
  return 0;
}

/* -- RMSNorm -------------------------------------------------------------------------- */

static int rmsnorm_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *x = node->inputs[0], *weight = node->inputs[1];
  tt_tensor *xc = node->saved[0], *rstd = node->saved[1];
  int need_x = tt_needs_grad(x), need_w = weight && tt_needs_grad(weight);
  if (!need_x && !need_w) return 0;
  const tt_norm_kernels *k = TT_KERNELS(tt_norm, xc->device);
  if (!k || !k->rmsnorm_backward) return tt_no_kernel(node->name, xc->device);
  int64_t D = xc->shape[xc->ndim - 1], N = tt_tensor_numel(xc) / D;
  tt_tensor *g = NULL, *wc = NULL, *dx = NULL, *dw = NULL;
  int rc = -1;
  if (tt_contiguous_nograd(grad_out, &g) != 0) goto done;
  if (weight && tt_contiguous_nograd(weight, &wc) != 0) goto done;
  if (need_x && tt_empty_like(xc, &dx) != 0) goto done;
  if (need_w && tt_empty_like(wc, &dw) != 0) goto done;
  if (k->rmsnorm_backward(dx ? tt_tensor_data(dx) : NULL, dw ? tt_tensor_data(dw) : NULL,
                          tt_tensor_data(g), tt_tensor_data(xc),
                          wc ? tt_tensor_data(wc) : NULL, tt_tensor_data(rstd), N, D) != 0)
    goto done;
  if (dx && tt_accumulate_grad(x, dx) != 0) goto done;
  if (dw && tt_accumulate_grad(weight, dw) != 0) goto done;
  rc = 0;
done:
  tt_tensor_release(g);
  tt_tensor_release(wc);
  tt_tensor_release(dx);
  tt_tensor_release(dw);
  return rc;
}

int tt_rmsnorm(tt_tensor *x, tt_tensor *weight, double eps, tt_tensor **out) {
  TT_CHECK(x && out, "rmsnorm: x and out must not be NULL");
  TT_TRY(check_norm_args("rmsnorm", x, weight, NULL, eps));
  const tt_norm_kernels *k = TT_KERNELS(tt_norm, x->device);
  if (!k || !k->rmsnorm_forward) return tt_no_kernel("rmsnorm", x->device);
  int64_t D = x->shape[x->ndim - 1], N = tt_tensor_numel(x) / D;

  tt_tensor *xc = NULL, *wc = NULL, *y = NULL, *rstd = NULL;
  if (tt_contiguous_nograd(x, &xc) != 0 || (weight && tt_contiguous_nograd(weight, &wc) != 0) ||
      tt_empty_like(xc, &y) != 0 || tt_tensor_empty(&N, 1, TT_F32, x->device, &rstd) != 0)
    goto fail;
  if (k->rmsnorm_forward(tt_tensor_data(y), tt_tensor_data(rstd), tt_tensor_data(xc),
                         wc ? tt_tensor_data(wc) : NULL, N, D, (float)eps) != 0)
    goto fail;
  tt_tensor *ins[2] = {x, weight};
  if (tt_should_record(ins, 2)) {
    tt_node *node = tt_record("rmsnorm", rmsnorm_backward, y, ins, 2);
    if (!node) goto fail;
    tt_node_save(node, xc);
    tt_node_save(node, rstd);
  }
  tt_tensor_release(xc);
  tt_tensor_release(wc);
  tt_tensor_release(rstd);
  *out = y;
  return 0;
fail:
  tt_tensor_release(xc);
  tt_tensor_release(wc);
  tt_tensor_release(y);
  tt_tensor_release(rstd);
  return -1;
}

/* -- LayerNorm ------------------------------------------------------------------------ */

/* saved: x contiguous, stats (2, N) = mean row then rstd row */
static int layernorm_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *x = node->inputs[0], *weight = node->inputs[1], *bias = node->inputs[2];
  tt_tensor *xc = node->saved[0], *stats = node->saved[1];
  int need_x = tt_needs_grad(x), need_w = weight && tt_needs_grad(weight);
  int need_b = bias && tt_needs_grad(bias);
  if (!need_x && !need_w && !need_b) return 0;
  const tt_norm_kernels *k = TT_KERNELS(tt_norm, xc->device);
  if (!k || !k->layernorm_backward) return tt_no_kernel(node->name, xc->device);
  int64_t D = xc->shape[xc->ndim - 1], N = tt_tensor_numel(xc) / D;
  tt_tensor *g = NULL, *wc = NULL, *dx = NULL, *dw = NULL, *db = NULL;
  int rc = -1;
  if (tt_contiguous_nograd(grad_out, &g) != 0) goto done;
  if (weight && tt_contiguous_nograd(weight, &wc) != 0) goto done;
  if (need_x && tt_empty_like(xc, &dx) != 0) goto done;
  if (need_w && tt_empty_like(wc, &dw) != 0) goto done;
  if (need_b && tt_empty_like(bias, &db) != 0) goto done;
  const float *mean = tt_tensor_data(stats);
  if (k->layernorm_backward(dx ? tt_tensor_data(dx) : NULL, dw ? tt_tensor_data(dw) : NULL,
                            db ? tt_tensor_data(db) : NULL, tt_tensor_data(g),
                            tt_tensor_data(xc), wc ? tt_tensor_data(wc) : NULL, mean,
                            mean + N, N, D) != 0)
    goto done;
  if (dx && tt_accumulate_grad(x, dx) != 0) goto done;
  if (dw && tt_accumulate_grad(weight, dw) != 0) goto done;
  if (db && tt_accumulate_grad(bias, db) != 0) goto done;
  rc = 0;
done:
  tt_tensor_release(g);
  tt_tensor_release(wc);
  tt_tensor_release(dx);
  tt_tensor_release(dw);
  tt_tensor_release(db);
  return rc;
}

int tt_layernorm(tt_tensor *x, tt_tensor *weight, tt_tensor *bias, double eps,
                 tt_tensor **out) {
  TT_CHECK(x && out, "layernorm: x and out must not be NULL");
  TT_TRY(check_norm_args("layernorm", x, weight, bias, eps));
  const tt_norm_kernels *k = TT_KERNELS(tt_norm, x->device);
  if (!k || !k->layernorm_forward) return tt_no_kernel("layernorm", x->device);
  int64_t D = x->shape[x->ndim - 1], N = tt_tensor_numel(x) / D;
  int64_t stats_shape[2] = {2, N};

  tt_tensor *xc = NULL, *wc = NULL, *bc = NULL, *y = NULL, *stats = NULL;
  if (tt_contiguous_nograd(x, &xc) != 0 || (weight && tt_contiguous_nograd(weight, &wc) != 0) ||
      (bias && tt_contiguous_nograd(bias, &bc) != 0) || tt_empty_like(xc, &y) != 0 ||
      tt_tensor_empty(stats_shape, 2, TT_F32, x->device, &stats) != 0)
    goto fail;
  float *mean = tt_tensor_data(stats);
  if (k->layernorm_forward(tt_tensor_data(y), mean, mean + N, tt_tensor_data(xc),
                           wc ? tt_tensor_data(wc) : NULL, bc ? tt_tensor_data(bc) : NULL,
                           N, D, (float)eps) != 0)
    goto fail;
  tt_tensor *ins[3] = {x, weight, bias};
  if (tt_should_record(ins, 3)) {
    tt_node *node = tt_record("layernorm", layernorm_backward, y, ins, 3);
    if (!node) goto fail;
    tt_node_save(node, xc);
    tt_node_save(node, stats);
  }
  tt_tensor_release(xc);
  tt_tensor_release(wc);
  tt_tensor_release(bc);
  tt_tensor_release(stats);
  *out = y;
  return 0;
fail:
  tt_tensor_release(xc);
  tt_tensor_release(wc);
  tt_tensor_release(bc);
  tt_tensor_release(y);
  tt_tensor_release(stats);
  return -1;
}

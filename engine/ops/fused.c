/*
** ops_fused.c — tt_add_rms_norm and tt_add_layer_norm: the residual add and the RMSNorm
** or LayerNorm that follows it in a pre-norm transformer block, in one pass over memory
** (kernels/fused.h).
**
**   h = x + residual          the residual stream, in x's dtype (f32 or bf16)
**   y = rmsnorm(h) * weight   in y_dtype: bf16 feeds a bf16 GEMM without a separate cast
**   (or layernorm(h) * weight + bias)
**
** Autograd sees the two ops it computes, an add and a norm, each with its own node, so
** gradients reach x, residual and weight as they would through tt_add and tt_rmsnorm.
** The norm's backward is fused the other way round: h's gradient usually already holds
** what the rest of the residual stream sent back (its later uses run their backward
** first), and the kernel adds the norm's contribution into it in the same pass that
** computes it; the weight gradient is the kernels' deterministic two-stage reduction.
*/
#include "core/tt_internal.h"
#include "fused.h"
#include <math.h>

static int fused_table(const char *op, int device, const tt_fused_kernels **pk) {
  const tt_fused_kernels *k = TT_KERNELS(tt_fused, device);
  if (!k || !k->add_norm_forward) return tt_no_kernel(op, device);
  *pk = k;
  return 0;
}

static int io_dtype(const char *op, const char *arg, const tt_tensor *t) {
  TT_CHECK(t->dtype == TT_F32 || t->dtype == TT_BF16, "%s: %s is %s; expected f32 or bf16",
           op, arg, tt_dtype_name(t->dtype));
  return 0;
}

/* -- The add's backward ---------------------------------------------------------------- */

/* inputs: x, residual. Both receive g unchanged. */
static int add_backward(tt_node *node, tt_tensor *g) {
  for (int i = 0; i < 2; i++)
    if (tt_needs_grad(node->inputs[i])) TT_TRY(tt_accumulate_grad(node->inputs[i], g));
  return 0;
}

/* -- The norm's backward ---------------------------------------------------------------- */

/* inputs: h, weight, bias (either may be NULL; bias only for LayerNorm); saved: the
** contiguous h, rstd, and LayerNorm's mean. i[0]: y's dtype. */
static int norm_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *h = node->inputs[0], *weight = node->inputs[1], *bias = node->inputs[2];
  tt_tensor *hc = node->saved[0], *rstd = node->saved[1];
  tt_tensor *mean = node->n_saved > 2 ? node->saved[2] : NULL;
  const int need_h = tt_needs_grad(h), need_w = weight && tt_needs_grad(weight);
  const int need_b = bias && tt_needs_grad(bias);
  if (!need_h && !need_w && !need_b) return 0;
  const tt_fused_kernels *k = NULL;
  TT_TRY(fused_table(node->name, hc->device, &k));
  const int64_t D = hc->shape[hc->ndim - 1], N = tt_tensor_numel(hc) / D;
  const int64_t P = (N + TT_FUSED_ROWS_PER_PART - 1) / TT_FUSED_ROWS_PER_PART;
  /* h's gradient buffer takes the sum in place when it is already there. */
  const int in_place = need_h && tt_grad_accumulates_in_place(h);
  tt_tensor *g = NULL, *wc = NULL, *dh = NULL, *dw = NULL, *db = NULL, *parts = NULL;
  int rc = -1;
  if (tt_contiguous_nograd(grad_out, &g) != 0) goto done;
  if (g->dtype != (int)node->i[0]) {
    tt_set_error("%s: output gradient is %s, the output %s", node->name,
                 tt_dtype_name(g->dtype), tt_dtype_name((int)node->i[0]));
    goto done;
  }
  if (weight && tt_contiguous_nograd(weight, &wc) != 0) goto done;
  if (need_h && !in_place && tt_empty_like(hc, &dh) != 0) goto done;
  if (need_w && tt_empty_like(wc, &dw) != 0) goto done;
  if (need_b && tt_empty_like(bias, &db) != 0) goto done;
  if (need_w || need_b) {
    const int64_t ps[2] = {2 * P, D};
    if (tt_tensor_empty(ps, 2, TT_F32, hc->device, &parts) != 0) goto done;
  }
  void *dh_out = in_place ? tt_tensor_data(h->grad) : dh ? tt_tensor_data(dh) : NULL;
  void *dh_in = in_place ? dh_out : NULL, *pp = parts ? tt_tensor_data(parts) : NULL;
  float *dwp = dw ? tt_tensor_data(dw) : NULL;
  const float *wp = wc ? tt_tensor_data(wc) : NULL;
  if (k->norm_backward(dh_out, dwp, db ? tt_tensor_data(db) : NULL, pp, tt_tensor_data(g),
                       dh_in, tt_tensor_data(hc), wp, mean ? tt_tensor_data(mean) : NULL,
                       tt_tensor_data(rstd), N, D, hc->dtype, g->dtype) != 0)
    goto done;
  if (dh && tt_accumulate_grad(h, dh) != 0) goto done;
  if (dw && tt_accumulate_grad(weight, dw) != 0) goto done;
  if (db && tt_accumulate_grad(bias, db) != 0) goto done;
  rc = 0;
done:
  tt_tensor_release(g);
  tt_tensor_release(wc);
  tt_tensor_release(dh);
  tt_tensor_release(dw);
  tt_tensor_release(db);
  tt_tensor_release(parts);
  return rc;
}

/* -- The op ----------------------------------------------------------------------------- */

static int check_args(const char *op, tt_tensor *x, tt_tensor *residual, tt_tensor *weight,
                      tt_tensor *bias, double eps, int y_dtype) {
  char a[96], b[96];
  TT_TRY(io_dtype(op, "x", x));
  TT_CHECK(x->ndim >= 1 && x->shape[x->ndim - 1] >= 1, "%s: x %s must have a non-empty last dim",
           op, tt_tensor_describe(x, a, sizeof a));
  TT_CHECK(eps >= 0.0 && isfinite(eps), "%s: eps must be finite and >= 0 (got %g)", op, eps);
  TT_CHECK(y_dtype == TT_F32 || y_dtype == TT_BF16, "%s: y dtype %s; expected f32 or bf16", op,
           tt_dtype_name(y_dtype));
  tt_tensor *all[4] = {x, residual, weight, bias};
  TT_TRY(tt_check_same_device(op, all, 4));
  if (residual) {
    int same = residual->ndim == x->ndim && residual->dtype == x->dtype;
    for (int d = 0; same && d < x->ndim; d++) same = residual->shape[d] == x->shape[d];
    TT_CHECK(same, "%s: residual %s must match x %s (shape and dtype)", op,
             tt_tensor_describe(residual, a, sizeof a), tt_tensor_describe(x, b, sizeof b));
  }
  const int64_t D = x->shape[x->ndim - 1];
  tt_tensor *vecs[2] = {weight, bias};
  for (int i = 0; i < 2; i++)
    TT_CHECK(!vecs[i] || (vecs[i]->dtype == TT_F32 && vecs[i]->ndim == 1 &&
                          vecs[i]->shape[0] == D),
             "%s: %s %s must be f32 (%lld) to match x %s", op, i ? "bias" : "weight",
             tt_tensor_describe(vecs[i], a, sizeof a), (long long)D,
             tt_tensor_describe(x, b, sizeof b));
  return 0;
}

/* Both ops: `layer` 1 is LayerNorm (mean, bias), 0 RMSNorm (bias NULL). */
static int add_norm(const char *op, int layer, tt_tensor *x, tt_tensor *residual,
                    tt_tensor *weight, tt_tensor *bias, double eps, int y_dtype,
                    tt_tensor **h_out, tt_tensor **y_out) {
  TT_CHECK(x && h_out && y_out, "%s: x, h_out and y_out must not be NULL", op);
  *h_out = *y_out = NULL;
  TT_TRY(check_args(op, x, residual, weight, bias, eps, y_dtype));
  const tt_fused_kernels *k = NULL;
  TT_TRY(fused_table(op, x->device, &k));
  const int64_t D = x->shape[x->ndim - 1], N = tt_tensor_numel(x) / D;
  tt_tensor *xc = NULL, *resc = NULL, *wc = NULL, *bc = NULL, *h = NULL, *y = NULL;
  tt_tensor *rstd = NULL, *mean = NULL;
  if (tt_contiguous_nograd(x, &xc) != 0) goto fail;
  if (residual && tt_contiguous_nograd(residual, &resc) != 0) goto fail;
  if (weight && tt_contiguous_nograd(weight, &wc) != 0) goto fail;
  if (bias && tt_contiguous_nograd(bias, &bc) != 0) goto fail;
  if (residual) {
    if (tt_empty_like(xc, &h) != 0) goto fail;
  } else {
    tt_tensor_retain(xc);
    h = xc;
  }
  if (tt_tensor_empty(x->shape, x->ndim, y_dtype, x->device, &y) != 0 ||
      tt_tensor_empty(&N, 1, TT_F32, x->device, &rstd) != 0 ||
      (layer && tt_tensor_empty(&N, 1, TT_F32, x->device, &mean) != 0))
    goto fail;
  void *hp = residual ? tt_tensor_data(h) : NULL, *resp = resc ? tt_tensor_data(resc) : NULL;
  const float *wp = wc ? tt_tensor_data(wc) : NULL;
  if (k->add_norm_forward(hp, tt_tensor_data(y), mean ? tt_tensor_data(mean) : NULL,
                          tt_tensor_data(rstd), tt_tensor_data(xc), resp, wp,
                          bc ? tt_tensor_data(bc) : NULL, N, D, (float)eps, x->dtype,
                          y_dtype) != 0)
    goto fail;
  /* The recorded graph: h = add(x, residual), then y = norm(h, weight, bias). Without a
  ** residual, h is x itself. */
  tt_tensor *hin = residual ? h : x;
  if (residual) {
    tt_tensor *ins[2] = {x, residual};
    if (tt_should_record(ins, 2) && !tt_record(layer ? "add_layer_norm.add" : "add_rms_norm.add",
                                               add_backward, h, ins, 2))
      goto fail;
  }
  tt_tensor *nins[3] = {hin, weight, bias};
  if (tt_should_record(nins, 3)) {
    tt_node *node = tt_record(layer ? "add_layer_norm.norm" : "add_rms_norm.norm",
                              norm_backward, y, nins, 3);
    if (!node) goto fail;
    tt_node_save(node, h);
    tt_node_save(node, rstd);
    if (layer) tt_node_save(node, mean);
    node->i[0] = y_dtype;
  }
  tt_tensor_release(xc);
  tt_tensor_release(resc);
  tt_tensor_release(wc);
  tt_tensor_release(bc);
  tt_tensor_release(rstd);
  tt_tensor_release(mean);
  if (!residual) {
    tt_tensor_release(h);
    tt_tensor_retain(x);
    h = x;
  }
  *h_out = h;
  *y_out = y;
  return 0;
fail:
  tt_tensor_release(xc);
  tt_tensor_release(resc);
  tt_tensor_release(wc);
  tt_tensor_release(bc);
  tt_tensor_release(h);
  tt_tensor_release(y);
  tt_tensor_release(rstd);
  tt_tensor_release(mean);
  return -1;
}

int tt_add_rms_norm(tt_tensor *x, tt_tensor *residual, tt_tensor *weight, double eps,
                    int y_dtype, tt_tensor **h_out, tt_tensor **y_out) {
  return add_norm("add_rms_norm", 0, x, residual, weight, NULL, eps, y_dtype, h_out, y_out);
}

int tt_add_layer_norm(tt_tensor *x, tt_tensor *residual, tt_tensor *weight, tt_tensor *bias,
                      double eps, int y_dtype, tt_tensor **h_out, tt_tensor **y_out) {
  return add_norm("add_layer_norm", 1, x, residual, weight, bias, eps, y_dtype, h_out, y_out);
}

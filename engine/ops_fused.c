/*
** ops_fused.c — tt_add_rms_norm: the residual add and the RMSNorm that follows it in a
** pre-norm transformer block, in one pass over memory (kernels/fused.h).
**
**   h = x + residual          the residual stream, in x's dtype (f32 or bf16)
**   y = rmsnorm(h) * weight   in y_dtype: bf16 feeds a bf16 GEMM without a separate cast
**
** Autograd sees the two ops it computes, an add and a norm, each with its own node, so
** gradients reach x, residual and weight as they would through tt_add and tt_rmsnorm.
** The norm's backward is fused the other way round: h's gradient usually already holds
** what the rest of the residual stream sent back (its later uses run their backward
** first), and the kernel adds the norm's contribution into it in the same pass that
** computes it; the weight gradient is the kernels' deterministic two-stage reduction.
*/
#include "tt_internal.h"
#include "fused.h"
#include <math.h>

static int fused_table(const char *op, int device, const tt_fused_kernels **pk) {
  const tt_fused_kernels *k = TT_KERNELS(tt_fused, device);
  if (!k || !k->add_rmsnorm_forward) return tt_no_kernel(op, device);
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

/* inputs: h, weight (may be NULL); saved: the contiguous h, rstd. i[0]: y's dtype. */
static int norm_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *h = node->inputs[0], *weight = node->inputs[1];
  tt_tensor *hc = node->saved[0], *rstd = node->saved[1];
  const int need_h = tt_needs_grad(h), need_w = weight && tt_needs_grad(weight);
  if (!need_h && !need_w) return 0;
  const tt_fused_kernels *k = NULL;
  TT_TRY(fused_table(node->name, hc->device, &k));
  const int64_t D = hc->shape[hc->ndim - 1], N = tt_tensor_numel(hc) / D;
  const int64_t P = (N + TT_FUSED_ROWS_PER_PART - 1) / TT_FUSED_ROWS_PER_PART;
  /* h's gradient buffer takes the sum in place when it is already there. */
  const int in_place = need_h && tt_grad_accumulates_in_place(h);
  tt_tensor *g = NULL, *wc = NULL, *dh = NULL, *dw = NULL, *parts = NULL;
  int rc = -1;
  if (tt_contiguous_nograd(grad_out, &g) != 0) goto done;
  if (g->dtype != (int)node->i[0]) {
    tt_set_error("%s: output gradient is %s, the output %s", node->name,
                 tt_dtype_name(g->dtype), tt_dtype_name((int)node->i[0]));
    goto done;
  }
  if (weight && tt_contiguous_nograd(weight, &wc) != 0) goto done;
  if (need_h && !in_place && tt_empty_like(hc, &dh) != 0) goto done;
  if (need_w) {
    const int64_t ps[2] = {P, D};
    if (tt_empty_like(wc, &dw) != 0 || tt_tensor_empty(ps, 2, TT_F32, hc->device, &parts) != 0)
      goto done;
  }
  void *dh_out = in_place ? tt_tensor_data(h->grad) : dh ? tt_tensor_data(dh) : NULL;
  if (k->rmsnorm_backward(dh_out, dw ? tt_tensor_data(dw) : NULL,
                          parts ? tt_tensor_data(parts) : NULL, tt_tensor_data(g),
                          in_place ? dh_out : NULL, tt_tensor_data(hc),
                          wc ? tt_tensor_data(wc) : NULL, tt_tensor_data(rstd), N, D,
                          hc->dtype, g->dtype) != 0)
    goto done;
  if (dh && tt_accumulate_grad(h, dh) != 0) goto done;
  if (dw && tt_accumulate_grad(weight, dw) != 0) goto done;
  rc = 0;
done:
  tt_tensor_release(g);
  tt_tensor_release(wc);
  tt_tensor_release(dh);
  tt_tensor_release(dw);
  tt_tensor_release(parts);
  return rc;
}

/* -- The op ----------------------------------------------------------------------------- */

static int check_args(const char *op, tt_tensor *x, tt_tensor *residual, tt_tensor *weight,
                      double eps, int y_dtype) {
  char a[96], b[96];
  TT_TRY(io_dtype(op, "x", x));
  TT_CHECK(x->ndim >= 1 && x->shape[x->ndim - 1] >= 1, "%s: x %s must have a non-empty last dim",
           op, tt_tensor_describe(x, a, sizeof a));
  TT_CHECK(eps >= 0.0 && isfinite(eps), "%s: eps must be finite and >= 0 (got %g)", op, eps);
  TT_CHECK(y_dtype == TT_F32 || y_dtype == TT_BF16, "%s: y dtype %s; expected f32 or bf16", op,
           tt_dtype_name(y_dtype));
  tt_tensor *all[3] = {x, residual, weight};
  TT_TRY(tt_check_same_device(op, all, 3));
  if (residual) {
    int same = residual->ndim == x->ndim && residual->dtype == x->dtype;
    for (int d = 0; same && d < x->ndim; d++) same = residual->shape[d] == x->shape[d];
    TT_CHECK(same, "%s: residual %s must match x %s (shape and dtype)", op,
             tt_tensor_describe(residual, a, sizeof a), tt_tensor_describe(x, b, sizeof b));
  }
  if (weight) {
    const int64_t D = x->shape[x->ndim - 1];
    TT_CHECK(weight->dtype == TT_F32 && weight->ndim == 1 && weight->shape[0] == D,
             "%s: weight %s must be f32 (%lld) to match x %s", op,
             tt_tensor_describe(weight, a, sizeof a), (long long)D,
             tt_tensor_describe(x, b, sizeof b));
  }
  return 0;
}

int tt_add_rms_norm(tt_tensor *x, tt_tensor *residual, tt_tensor *weight, double eps,
                    int y_dtype, tt_tensor **h_out, tt_tensor **y_out) {
  const char *op = "add_rms_norm";
  TT_CHECK(x && h_out && y_out, "%s: x, h_out and y_out must not be NULL", op);
  *h_out = *y_out = NULL;
  TT_TRY(check_args(op, x, residual, weight, eps, y_dtype));
  const tt_fused_kernels *k = NULL;
  TT_TRY(fused_table(op, x->device, &k));
  const int64_t D = x->shape[x->ndim - 1], N = tt_tensor_numel(x) / D;
  tt_tensor *xc = NULL, *resc = NULL, *wc = NULL, *h = NULL, *y = NULL, *rstd = NULL;
  if (tt_contiguous_nograd(x, &xc) != 0) goto fail;
  if (residual && tt_contiguous_nograd(residual, &resc) != 0) goto fail;
  if (weight && tt_contiguous_nograd(weight, &wc) != 0) goto fail;
  if (residual) {
    if (tt_empty_like(xc, &h) != 0) goto fail;
  } else {
    tt_tensor_retain(xc);
    h = xc;
  }
  if (tt_tensor_empty(x->shape, x->ndim, y_dtype, x->device, &y) != 0 ||
      tt_tensor_empty(&N, 1, TT_F32, x->device, &rstd) != 0)
    goto fail;
  if (k->add_rmsnorm_forward(residual ? tt_tensor_data(h) : NULL, tt_tensor_data(y),
                             tt_tensor_data(rstd), tt_tensor_data(xc),
                             resc ? tt_tensor_data(resc) : NULL, wc ? tt_tensor_data(wc) : NULL,
                             N, D, (float)eps, x->dtype, y_dtype) != 0)
    goto fail;
  /* The recorded graph: h = add(x, residual), then y = norm(h, weight). Without a
  ** residual, h is x itself. */
  tt_tensor *hin = residual ? h : x;
  if (residual) {
    tt_tensor *ins[2] = {x, residual};
    if (tt_should_record(ins, 2) && !tt_record("add_rms_norm.add", add_backward, h, ins, 2))
      goto fail;
  }
  tt_tensor *nins[2] = {hin, weight};
  if (tt_should_record(nins, 2)) {
    tt_node *node = tt_record("add_rms_norm.norm", norm_backward, y, nins, 2);
    if (!node) goto fail;
    tt_node_save(node, h);
    tt_node_save(node, rstd);
    node->i[0] = y_dtype;
  }
  tt_tensor_release(xc);
  tt_tensor_release(resc);
  tt_tensor_release(wc);
  tt_tensor_release(rstd);
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
  tt_tensor_release(h);
  tt_tensor_release(y);
  tt_tensor_release(rstd);
  return -1;
}

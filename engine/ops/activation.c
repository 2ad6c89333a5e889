/*
** ops_activation.c — tt_silu, tt_gelu, tt_swiglu: validation, dispatch through the
** activation kernel table (kernels/activation.h) and their autograd nodes; bf16 SwiGLU
** and GELU run the fused vectorised kernels (kernels/fused.h).
**
** Each node saves the contiguous input(s) it read, so backward never re-copies a strided
** view.
*/
#include "core/tt_internal.h"
#include "activation.h"
#include "fused.h"

enum { ACT_SILU = 0, ACT_GELU = 1 };

static const char *const act_names[] = {"silu", "gelu"};

static const tt_activation_kernels *act_kernels(int device) {
  return TT_KERNELS(tt_activation, device);
}

/* -- SiLU and GELU: y = f(x), x any shape ------------------------------------------- */

/* f32 runs the activation family's kernels; bf16 GELU the fused vectorised one
** (kernels/fused.h), which reads and writes bf16 and computes in f32. */
static int unary_backward(tt_node *node, tt_tensor *grad_out) {
  int kind = (int)node->i[0];
  tt_tensor *x = node->inputs[0], *xc = node->saved[0];
  if (!tt_needs_grad(x)) return 0;
  const tt_activation_kernels *k = act_kernels(xc->device);
  const tt_fused_kernels *fk = TT_KERNELS(tt_fused, xc->device);
  const int low = xc->dtype != TT_F32;
  int (*bwd)(float *, const float *, const float *, int64_t) =
      !k ? NULL : kind == ACT_SILU ? k->silu_backward : k->gelu_backward;
  if (low ? !fk || !fk->gelu_backward : !bwd) return tt_no_kernel(node->name, xc->device);
  tt_tensor *g = NULL, *dx = NULL;
  int rc = -1;
  if (tt_contiguous_nograd(grad_out, &g) != 0 || tt_empty_like(xc, &dx) != 0) goto done;
  if (g->dtype != xc->dtype) {
    tt_set_error("%s: output gradient is %s, the input %s", node->name, tt_dtype_name(g->dtype),
                 tt_dtype_name(xc->dtype));
    goto done;
  }
  if (low ? fk->gelu_backward(tt_tensor_data(dx), tt_tensor_data(g), tt_tensor_data(xc),
                              tt_tensor_numel(xc), xc->dtype)
          : bwd(tt_tensor_data(dx), tt_tensor_data(g), tt_tensor_data(xc), tt_tensor_numel(xc)))
    goto done;
  rc = tt_accumulate_grad(x, dx);
done:
  tt_tensor_release(g);
  tt_tensor_release(dx);
  return rc;
}

static int unary_op(int kind, tt_tensor *x, tt_tensor **out) {
  const char *op = act_names[kind];
  TT_CHECK(x && out, "%s: x and out must not be NULL", op);
  const int low = x->dtype != TT_F32;
  if (kind == ACT_GELU)
    TT_CHECK(x->dtype == TT_F32 || x->dtype == TT_BF16, "%s: x is %s; expected f32 or bf16",
             op, tt_dtype_name(x->dtype));
  else
    TT_TRY(tt_check_dtype(op, "x", x, TT_F32));
  const tt_activation_kernels *k = act_kernels(x->device);
  const tt_fused_kernels *fk = TT_KERNELS(tt_fused, x->device);
  int (*fwd)(float *, const float *, int64_t) =
      !k ? NULL : kind == ACT_SILU ? k->silu_forward : k->gelu_forward;
  if (low ? !fk || !fk->gelu_forward : !fwd) return tt_no_kernel(op, x->device);

  tt_tensor *xc = NULL, *y = NULL;
  if (tt_contiguous_nograd(x, &xc) != 0 || tt_empty_like(xc, &y) != 0) goto fail;
  if (low ? fk->gelu_forward(tt_tensor_data(y), tt_tensor_data(xc), tt_tensor_numel(xc),
                             xc->dtype)
          : fwd(tt_tensor_data(y), tt_tensor_data(xc), tt_tensor_numel(xc)))
    goto fail;
  if (tt_should_record(&x, 1)) {
    tt_node *node = tt_record(op, unary_backward, y, &x, 1);
    if (!node) goto fail;
    node->i[0] = kind;
    tt_node_save(node, xc);
  }
  tt_tensor_release(xc);
  *out = y;
  return 0;
fail:
  tt_tensor_release(xc);
  tt_tensor_release(y);
  return -1;
}

int tt_silu(tt_tensor *x, tt_tensor **out) { return unary_op(ACT_SILU, x, out); }
int tt_gelu(tt_tensor *x, tt_tensor **out) { return unary_op(ACT_GELU, x, out); }

/* -- SwiGLU: y = silu(gate) * up, gate and up of the same shape ------------------------ */

static int swiglu_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *gate = node->inputs[0], *up = node->inputs[1];
  tt_tensor *gc = node->saved[0], *uc = node->saved[1];
  int need_gate = tt_needs_grad(gate), need_up = tt_needs_grad(up);
  if (!need_gate && !need_up) return 0;
  const tt_activation_kernels *k = act_kernels(gc->device);
  const tt_fused_kernels *fk = TT_KERNELS(tt_fused, gc->device);
  const int low = gc->dtype != TT_F32;
  if (low ? !fk || !fk->swiglu_backward : !k || !k->swiglu_backward)
    return tt_no_kernel(node->name, gc->device);
  tt_tensor *g = NULL, *dgate = NULL, *dup = NULL;
  int rc = -1;
  if (tt_contiguous_nograd(grad_out, &g) != 0) goto done;
  if (g->dtype != gc->dtype) {
    tt_set_error("swiglu: output gradient is %s, the inputs %s", tt_dtype_name(g->dtype),
                 tt_dtype_name(gc->dtype));
    goto done;
  }
  if (need_gate && tt_empty_like(gc, &dgate) != 0) goto done;
  if (need_up && tt_empty_like(uc, &dup) != 0) goto done;
  void *pdg = dgate ? tt_tensor_data(dgate) : NULL, *pdu = dup ? tt_tensor_data(dup) : NULL;
  if (low ? fk->swiglu_backward(pdg, pdu, tt_tensor_data(g), tt_tensor_data(gc),
                                tt_tensor_data(uc), tt_tensor_numel(gc), gc->dtype)
          : k->swiglu_backward(pdg, pdu, tt_tensor_data(g), tt_tensor_data(gc),
                               tt_tensor_data(uc), tt_tensor_numel(gc)))
    goto done;
  if (dgate && tt_accumulate_grad(gate, dgate) != 0) goto done;
  if (dup && tt_accumulate_grad(up, dup) != 0) goto done;
  rc = 0;
done:
  tt_tensor_release(g);
  tt_tensor_release(dgate);
  tt_tensor_release(dup);
  return rc;
}

int tt_swiglu(tt_tensor *gate, tt_tensor *up, tt_tensor **out) {
  TT_CHECK(gate && up && out, "swiglu: gate, up and out must not be NULL");
  /* f32 runs the activation family's kernels; bf16 the fused vectorised ones
  ** (kernels/fused.h), which read and write bf16 and compute in f32. */
  TT_CHECK(gate->dtype == up->dtype && (gate->dtype == TT_F32 || gate->dtype == TT_BF16),
           "swiglu: gate is %s and up %s; expected both f32 or both bf16",
           tt_dtype_name(gate->dtype), tt_dtype_name(up->dtype));
  tt_tensor *ins[2] = {gate, up};
  TT_TRY(tt_check_same_device("swiglu", ins, 2));
  int same = gate->ndim == up->ndim;
  for (int d = 0; same && d < gate->ndim; d++) same = gate->shape[d] == up->shape[d];
  if (!same) {
    char a[96], b[96];
    return tt_set_error("swiglu: gate %s and up %s must have the same shape",
                        tt_tensor_describe(gate, a, sizeof a),
                        tt_tensor_describe(up, b, sizeof b));
  }
  const tt_activation_kernels *k = act_kernels(gate->device);
  const tt_fused_kernels *fk = TT_KERNELS(tt_fused, gate->device);
  const int low = gate->dtype != TT_F32;
  if (low ? !fk || !fk->swiglu_forward : !k || !k->swiglu_forward)
    return tt_no_kernel("swiglu", gate->device);

  tt_tensor *gc = NULL, *uc = NULL, *y = NULL;
  if (tt_contiguous_nograd(gate, &gc) != 0 || tt_contiguous_nograd(up, &uc) != 0 ||
      tt_empty_like(gc, &y) != 0)
    goto fail;
  if (low ? fk->swiglu_forward(tt_tensor_data(y), tt_tensor_data(gc), tt_tensor_data(uc),
                               tt_tensor_numel(gc), gc->dtype)
          : k->swiglu_forward(tt_tensor_data(y), tt_tensor_data(gc), tt_tensor_data(uc),
                              tt_tensor_numel(gc)))
    goto fail;
  if (tt_should_record(ins, 2)) {
    tt_node *node = tt_record("swiglu", swiglu_backward, y, ins, 2);
    if (!node) goto fail;
    tt_node_save(node, gc);
    tt_node_save(node, uc);
  }
  tt_tensor_release(gc);
  tt_tensor_release(uc);
  *out = y;
  return 0;
fail:
  tt_tensor_release(gc);
  tt_tensor_release(uc);
  tt_tensor_release(y);
  return -1;
}

/*
** reduce.c — sum, mean and max over a list of dims and softmax over one dim (the plan and
** the sum they share with tt_reduce_to_shape are in core/grad.c).
**
** The kernels (kernels/reduce.h) reduce the middle dim of a contiguous (outer, r, inner)
** block. When the reduced dims are adjacent (ignoring size-1 dims) the input is used as
** it is; otherwise it is copied once with the kept dims first and the reduced dims last,
** giving (outer, r, 1). In both cases the output (outer, inner) is laid out like the
** kept dims in order, so it is the user's output tensor as it stands.
*/
#include "reduce.h"
#include "core/tt_internal.h"
#include "core/grad.h"

/* -- Plans --------------------------------------------------------------------------- */

static int reduce_table(const char *op, int device, const tt_reduce_kernels **pk) {
  const tt_reduce_kernels *k = TT_KERNELS(tt_reduce, device);
  if (!k) return tt_no_kernel(op, device);
  *pk = k;
  return 0;
}

/* Validates a user dim list into per-dim flags and the output shape. */
static int parse_dims(const char *op, const tt_tensor *x, const int *dims, int ndims,
                      int keepdim, int *reduced, int64_t *out_shape, int *out_ndim) {
  TT_CHECK(ndims >= 0 && ndims <= TT_MAX_DIMS, "%s: %d dims given, expected 0 to %d", op,
           ndims, TT_MAX_DIMS);
  TT_CHECK(ndims == 0 || dims, "%s: dims is NULL but ndims is %d", op, ndims);
  for (int d = 0; d < x->ndim; d++) reduced[d] = ndims == 0;
  for (int i = 0; i < ndims; i++) {
    int d = 0;
    TT_TRY(tt_norm_dim(op, dims[i], x->ndim, &d));
    TT_CHECK(!reduced[d], "%s: dim %d appears twice in the dim list", op, dims[i]);
    reduced[d] = 1;
  }
  int n = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (!reduced[d]) out_shape[n++] = x->shape[d];
    else if (keepdim) out_shape[n++] = 1;
  }
  *out_ndim = n;
  return 0;
}

/* A gradient computed in the plan's layout, viewed in x's dim order (strided when the
** plan permuted x). */
static int plan_unpermute(tt_tensor *gx, const tt_tensor *x, const tt_reduce_plan *p,
                          tt_tensor **out) {
  if (!p->permuted) {
    tt_tensor_retain(gx);
    *out = gx;
    return 0;
  }
  tt_tensor *v = tt_tensor_header_alias(gx);
  if (!v) return -1;
  for (int d = 0; d < x->ndim; d++) {
    v->shape[p->perm[d]] = gx->shape[d];
    v->stride[p->perm[d]] = gx->stride[d];
  }
  *out = v;
  return 0;
}

/* Empty tensor laid out as the plan's input block: x's shape in plan order. */
static int plan_empty(const tt_tensor *x, const tt_reduce_plan *p, tt_tensor **out) {
  int64_t shape[TT_MAX_DIMS];
  for (int d = 0; d < x->ndim; d++) shape[d] = x->shape[p->permuted ? p->perm[d] : d];
  return tt_tensor_empty(shape, x->ndim, TT_F32, x->device, out);
}

static void *plan_copy(const tt_reduce_plan *p) {
  tt_reduce_plan *c = malloc(sizeof *c);
  if (c) *c = *p;
  else tt_set_error("reduce: out of host memory (plan)");
  return c;
}

/* -- Sum and mean -------------------------------------------------------------------- */

/* node->f[0]: scale; ctx: the plan. */
static int sum_backward(tt_node *node, tt_tensor *g) {
  tt_tensor *x = node->inputs[0];
  const tt_reduce_plan *p = node->ctx;
  const tt_reduce_kernels *k = NULL;
  TT_TRY(reduce_table(node->name, g->device, &k));
  if (!k->sum_backward) return tt_no_kernel(node->name, g->device);
  tt_tensor *gc = NULL, *gx = NULL, *gv = NULL;
  int st = tt_contiguous_nograd(g, &gc);
  if (st == 0) st = plan_empty(x, p, &gx);
  if (st == 0 && tt_tensor_numel(gx) > 0)
    st = k->sum_backward(tt_tensor_data(gx), tt_tensor_data(gc), p->outer, p->r, p->inner,
                         (float)node->f[0]);
  if (st == 0) st = plan_unpermute(gx, x, p, &gv);
  if (st == 0) st = tt_accumulate_grad(x, gv);
  tt_tensor_release(gv);
  tt_tensor_release(gx);
  tt_tensor_release(gc);
  return st;
}

static int sum_op(const char *op, int mean, tt_tensor *x, const int *dims, int ndims,
                  int keepdim, tt_tensor **out) {
  if (!out) return tt_set_error("%s: out is NULL", op);
  *out = NULL;
  if (!x) return tt_set_error("%s: x is NULL", op);
  TT_TRY(tt_check_dtype(op, "x", x, TT_F32));
  int reduced[TT_MAX_DIMS];
  int64_t shape[TT_MAX_DIMS];
  int ndim = 0;
  TT_TRY(parse_dims(op, x, dims, ndims, keepdim, reduced, shape, &ndim));
  tt_reduce_plan p;
  tt_reduce_plan_build(x, reduced, &p);
  const float scale = mean ? (float)(1.0 / (double)p.r) : 1.0f;

  tt_tensor *o = NULL;
  TT_TRY(tt_tensor_empty(shape, ndim, TT_F32, x->device, &o));
  int st = tt_reduce_plan_sum(op, x, &p, scale, o);
  if (st == 0 && tt_should_record(&x, 1)) {
    void *ctx = plan_copy(&p);
    tt_node *node = ctx ? tt_record(op, sum_backward, o, &x, 1) : NULL;
    if (!node) {
      free(ctx);
      st = -1;
    } else {
      node->ctx = ctx;
      node->free_ctx = free;
      node->f[0] = scale;
    }
  }
  if (st != 0) {
    tt_tensor_release(o);
    return -1;
  }
  *out = o;
  return 0;
}

int tt_sum(tt_tensor *x, const int *dims, int ndims, int keepdim, tt_tensor **out) {
  return sum_op("tt_sum", 0, x, dims, ndims, keepdim, out);
}

int tt_mean(tt_tensor *x, const int *dims, int ndims, int keepdim, tt_tensor **out) {
  return sum_op("tt_mean", 1, x, dims, ndims, keepdim, out);
}

/* -- Max ----------------------------------------------------------------------------- */

/* saved[0]: the index (within r) of each output's maximum; ctx: the plan. */
static int max_backward(tt_node *node, tt_tensor *g) {
  tt_tensor *x = node->inputs[0], *idx = node->saved[0];
  const tt_reduce_plan *p = node->ctx;
  const tt_reduce_kernels *k = NULL;
  TT_TRY(reduce_table("tt_max", g->device, &k));
  if (!k->max_backward) return tt_no_kernel("tt_max", g->device);
  tt_tensor *gc = NULL, *gx = NULL, *gv = NULL;
  int st = tt_contiguous_nograd(g, &gc);
  if (st == 0) st = plan_empty(x, p, &gx);
  if (st == 0 && tt_tensor_numel(gx) > 0)
    st = k->max_backward(tt_tensor_data(gx), tt_tensor_data(gc), tt_tensor_data(idx),
                         p->outer, p->r, p->inner);
  if (st == 0) st = plan_unpermute(gx, x, p, &gv);
  if (st == 0) st = tt_accumulate_grad(x, gv);
  tt_tensor_release(gv);
  tt_tensor_release(gx);
  tt_tensor_release(gc);
  return st;
}

int tt_max(tt_tensor *x, const int *dims, int ndims, int keepdim, tt_tensor **out) {
  const char *op = "tt_max";
  char sx[160];
  if (!out) return tt_set_error("%s: out is NULL", op);
  *out = NULL;
  if (!x) return tt_set_error("%s: x is NULL", op);
  TT_TRY(tt_check_dtype(op, "x", x, TT_F32));
  int reduced[TT_MAX_DIMS];
  int64_t shape[TT_MAX_DIMS];
  int ndim = 0;
  TT_TRY(parse_dims(op, x, dims, ndims, keepdim, reduced, shape, &ndim));
  tt_reduce_plan p;
  tt_reduce_plan_build(x, reduced, &p);
  TT_CHECK(p.r > 0, "%s: cannot take the max over an empty dim of a %s tensor", op,
           tt_shape_str(x->shape, x->ndim, sx, sizeof sx));
  const tt_reduce_kernels *k = NULL;
  TT_TRY(reduce_table(op, x->device, &k));
  if (!k->max) return tt_no_kernel(op, x->device);

  tt_tensor *o = NULL, *idx = NULL, *xin = NULL;
  int st = tt_tensor_empty(shape, ndim, TT_F32, x->device, &o);
  if (st == 0) st = tt_tensor_empty(shape, ndim, TT_I64, x->device, &idx);
  if (st == 0 && tt_tensor_numel(o) > 0) {
    st = tt_reduce_plan_input(x, &p, &xin);
    if (st == 0)
      st = k->max(tt_tensor_data(o), tt_tensor_data(idx), tt_tensor_data(xin), p.outer, p.r,
                  p.inner);
  }
  if (st == 0 && tt_should_record(&x, 1)) {
    void *ctx = plan_copy(&p);
    tt_node *node = ctx ? tt_record(op, max_backward, o, &x, 1) : NULL;
    if (!node) {
      free(ctx);
      st = -1;
    } else {
      node->ctx = ctx;
      node->free_ctx = free;
      tt_node_save(node, idx);
    }
  }
  tt_tensor_release(xin);
  tt_tensor_release(idx);
  if (st != 0) {
    tt_tensor_release(o);
    return -1;
  }
  *out = o;
  return 0;
}

/* -- Softmax ------------------------------------------------------------------------- */

/* i[0..2]: outer, r, inner. The output y (node->out) is all the backward needs. */
static int softmax_backward(tt_node *node, tt_tensor *g) {
  tt_tensor *x = node->inputs[0], *y = node->out;
  const tt_reduce_kernels *k = NULL;
  TT_TRY(reduce_table("tt_softmax", g->device, &k));
  if (!k->softmax_backward) return tt_no_kernel("tt_softmax", g->device);
  tt_tensor *gc = NULL, *gx = NULL;
  int st = tt_contiguous_nograd(g, &gc);
  if (st == 0) st = tt_empty_like(y, &gx);
  if (st == 0 && tt_tensor_numel(gx) > 0)
    st = k->softmax_backward(tt_tensor_data(gx), tt_tensor_data(gc), tt_tensor_data(y),
                             node->i[0], node->i[1], node->i[2]);
  if (st == 0) st = tt_accumulate_grad(x, gx);
  tt_tensor_release(gx);
  tt_tensor_release(gc);
  return st;
}

int tt_softmax(tt_tensor *x, int dim, tt_tensor **out) {
  const char *op = "tt_softmax";
  if (!out) return tt_set_error("%s: out is NULL", op);
  *out = NULL;
  if (!x) return tt_set_error("%s: x is NULL", op);
  TT_TRY(tt_check_dtype(op, "x", x, TT_F32));
  int d = 0;
  TT_TRY(tt_norm_dim(op, dim, x->ndim, &d));
  const tt_reduce_kernels *k = NULL;
  TT_TRY(reduce_table(op, x->device, &k));
  if (!k->softmax) return tt_no_kernel(op, x->device);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; i++) outer *= x->shape[i];
  for (int i = d + 1; i < x->ndim; i++) inner *= x->shape[i];

  tt_tensor *xin = NULL, *y = NULL;
  TT_TRY(tt_contiguous_nograd(x, &xin));
  int st = tt_empty_like(xin, &y);
  if (st == 0 && tt_tensor_numel(y) > 0)
    st = k->softmax(tt_tensor_data(y), tt_tensor_data(xin), outer, x->shape[d], inner);
  tt_tensor_release(xin);
  if (st == 0 && tt_should_record(&x, 1)) {
    tt_node *node = tt_record(op, softmax_backward, y, &x, 1);
    if (!node) st = -1;
    else {
      node->i[0] = outer;
      node->i[1] = x->shape[d];
      node->i[2] = inner;
    }
  }
  if (st != 0) {
    tt_tensor_release(y);
    return -1;
  }
  *out = y;
  return 0;
}

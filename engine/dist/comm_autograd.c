/*
** comm_autograd.c — collectives as differentiable ops, in conjugate pairs.
**
** Tensor parallelism (Megatron): a column-parallel layer's input goes through
** copy_to_group (identity forward, a view; all-reduce of the input gradient backward:
** every rank used the same x), a row-parallel layer's output through reduce_from_group
** (all-reduce forward, identity backward). Sequence parallelism swaps them for sp_gather /
** sp_reduce_scatter along the sequence dim; gather_from_group / scatter_to_group move
** between a replicated tensor and its shards. The group pointer rides in node->ctx and
** the dim in node->i[0]; groups outlive the tape.
*/
#include "dist/dist_internal.h"

/* -- Backward functions -------------------------------------------------------------- */

static int accumulate_into_input(tt_node *node, tt_tensor *g) {
  tt_tensor *x = node->inputs[0];
  int rc = tt_needs_grad(x) ? tt_accumulate_grad(x, g) : 0;
  tt_tensor_release(g);
  return rc;
}

/* dx = sum over the group of dy (every rank's output depended on the same x). */
static int copy_to_group_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *g = NULL;
  TT_TRY(tt_clone(grad_out, &g));
  if (tt_comm_all_reduce(node->ctx, g, TT_REDUCE_SUM) != 0) {
    tt_tensor_release(g);
    return -1;
  }
  return accumulate_into_input(node, g);
}

static int identity_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor_retain(grad_out);
  return accumulate_into_input(node, grad_out);
}

/* dx = this rank's block of dy along dim. */
static int take_block_backward(tt_node *node, tt_tensor *grad_out) {
  tt_comm *c = node->ctx;
  int dim = (int)node->i[0];
  int64_t len = grad_out->shape[dim] / c->size;
  tt_tensor *g = NULL;
  TT_TRY(tt_narrow(grad_out, dim, c->rank * len, len, &g));
  return accumulate_into_input(node, g);
}

static int all_gather_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *g = NULL;
  TT_TRY(tt_comm_all_gather(node->ctx, grad_out, (int)node->i[0], &g));
  return accumulate_into_input(node, g);
}

static int reduce_scatter_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *g = NULL;
  TT_TRY(tt_comm_reduce_scatter(node->ctx, grad_out, (int)node->i[0], TT_REDUCE_SUM, &g));
  return accumulate_into_input(node, g);
}

/* -- Forward ------------------------------------------------------------------------- */

typedef enum { FWD_COPY, FWD_ALL_REDUCE, FWD_ALL_GATHER, FWD_TAKE_BLOCK, FWD_REDUCE_SCATTER }
    fwd_kind;

/* copy_to_group's output: a header of its own over x's storage, as one process would
** read x itself (no copy: an activation's would be held until backward), sharing x's
** bf16 / fp16 copy when x is a weight, so a replicated weight is not cast again each
** forward (the copy belongs to the storage's values: lowp_weight.c). */
static int alias_of(tt_tensor *x, tt_tensor **out) {
  tt_tensor *y = tt_tensor_header_alias(x);
  if (!y) return -1;
  if (x->lowp) {
    tt_tensor_retain(x->lowp);
    y->lowp = x->lowp;
    y->lowp_version = x->lowp_version;
  }
  *out = y;
  return 0;
}

static int forward(tt_comm *c, tt_tensor *x, fwd_kind kind, int dim, tt_tensor **out) {
  switch (kind) {
  case FWD_COPY: return alias_of(x, out);
  case FWD_ALL_REDUCE:
    TT_TRY(tt_clone(x, out));
    return tt_comm_all_reduce(c, *out, TT_REDUCE_SUM);
  case FWD_ALL_GATHER: return tt_comm_all_gather(c, x, dim, out);
  case FWD_REDUCE_SCATTER: return tt_comm_reduce_scatter(c, x, dim, TT_REDUCE_SUM, out);
  case FWD_TAKE_BLOCK: {
    TT_CHECK(x->shape[dim] % c->size == 0,
             "scatter_to_group: dim %d of size %lld does not divide by group %s of size %d",
             dim, (long long)x->shape[dim], c->name, c->size);
    int64_t len = x->shape[dim] / c->size;
    tt_tensor *block = NULL;
    TT_TRY(tt_narrow(x, dim, c->rank * len, len, &block));
    int rc = tt_clone(block, out);
    tt_tensor_release(block);
    return rc;
  }
  }
  return tt_set_error("collective: unknown kind");
}

static int diff_collective(const char *name, tt_backward_fn backward, fwd_kind kind,
                           tt_comm *c, tt_tensor *x, int dim, tt_tensor **out) {
  *out = NULL;
  TT_CHECK(c && x, "%s: missing group or tensor", name);
  if (kind != FWD_COPY && kind != FWD_ALL_REDUCE)
    TT_TRY(tt_norm_dim(name, dim, x->ndim, &dim));
  int record = tt_should_record(&x, 1);
  int prev = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  tt_tensor *y = NULL;
  int rc = forward(c, x, kind, dim, &y);
  tt_set_grad_enabled(prev);
  if (rc != 0) return tt_error_context("%s", name);
  if (record) {
    tt_node *node = tt_record(name, backward, y, &x, 1);
    if (!node) {
      tt_tensor_release(y);
      return -1;
    }
    node->ctx = c;
    node->i[0] = dim;
  }
  *out = y;
  return 0;
}

int tt_dist_copy_to_group(tt_comm *c, tt_tensor *x, tt_tensor **out) {
  return diff_collective("copy_to_group", copy_to_group_backward, FWD_COPY, c, x, 0, out);
}
int tt_dist_reduce_from_group(tt_comm *c, tt_tensor *x, tt_tensor **out) {
  return diff_collective("reduce_from_group", identity_backward, FWD_ALL_REDUCE, c, x, 0,
                         out);
}
int tt_dist_gather_from_group(tt_comm *c, tt_tensor *x, int dim, tt_tensor **out) {
  return diff_collective("gather_from_group", take_block_backward, FWD_ALL_GATHER, c, x,
                         dim, out);
}
int tt_dist_scatter_to_group(tt_comm *c, tt_tensor *x, int dim, tt_tensor **out) {
  return diff_collective("scatter_to_group", all_gather_backward, FWD_TAKE_BLOCK, c, x, dim,
                         out);
}
int tt_dist_sp_gather(tt_comm *c, tt_tensor *x, int dim, tt_tensor **out) {
  return diff_collective("sp_gather", reduce_scatter_backward, FWD_ALL_GATHER, c, x, dim,
                         out);
}
int tt_dist_sp_reduce_scatter(tt_comm *c, tt_tensor *x, int dim, tt_tensor **out) {
  return diff_collective("sp_reduce_scatter", all_gather_backward, FWD_REDUCE_SCATTER, c, x,
                         dim, out);
}

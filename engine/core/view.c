/*
** view.c — views that share storage (view/reshape, transpose, permute, narrow, expand),
** contiguous copies, clones, casts and detach. Each records its backward on the tape.
*/
#include "core/tt_internal.h"

/* -- Backward functions -------------------------------------------------------------- */

static int view_backward(tt_node *node, tt_tensor *g) {
  tt_tensor *in = node->inputs[0], *gi = NULL;
  TT_TRY(tt_view(g, in->shape, in->ndim, &gi));
  int rc = tt_accumulate_grad(in, gi);
  tt_tensor_release(gi);
  return rc;
}

static int transpose_backward(tt_node *node, tt_tensor *g) {
  tt_tensor *gi = NULL;
  TT_TRY(tt_transpose(g, (int)node->i[0], (int)node->i[1], &gi));
  int rc = tt_accumulate_grad(node->inputs[0], gi);
  tt_tensor_release(gi);
  return rc;
}

static int permute_backward(tt_node *node, tt_tensor *g) {
  int inverse[TT_MAX_DIMS];
  for (int d = 0; d < g->ndim; d++) inverse[node->i[d]] = d;
  tt_tensor *gi = NULL;
  TT_TRY(tt_permute(g, inverse, g->ndim, &gi));
  int rc = tt_accumulate_grad(node->inputs[0], gi);
  tt_tensor_release(gi);
  return rc;
}

static int narrow_backward(tt_node *node, tt_tensor *g) {
  tt_tensor *in = node->inputs[0], *full = NULL, *part = NULL;
  if (in->grad && !in->is_leaf) {
    /* A gradient is being gathered already (the other parts of one result, such as a
    ** fused q/k/v GEMM's): this part's is added into its block, not into a zero copy of
    ** the whole. */
    TT_TRY(tt_narrow(in->grad, (int)node->i[0], node->i[1], node->i[2], &part));
    const int rc = tt_axpy_(part, 1.0, g);
    tt_tensor_release(part);
    return rc;
  }
  TT_TRY(tt_zeros_like(in, &full));
  int rc = tt_narrow(full, (int)node->i[0], node->i[1], node->i[2], &part);
  if (rc == 0) rc = tt_copy_(part, g);
  if (rc == 0) rc = tt_accumulate_grad(in, full);
  tt_tensor_release(part);
  tt_tensor_release(full);
  return rc;
}

static int expand_backward(tt_node *node, tt_tensor *g) {
  tt_tensor *in = node->inputs[0], *gi = NULL;
  TT_TRY(tt_reduce_to_shape(g, in->shape, in->ndim, &gi));
  int rc = tt_accumulate_grad(in, gi);
  tt_tensor_release(gi);
  return rc;
}

static int identity_backward(tt_node *node, tt_tensor *g) {
  return tt_accumulate_grad(node->inputs[0], g);
}

static int cast_backward(tt_node *node, tt_tensor *g) {
  tt_tensor *gi = NULL;
  TT_TRY(tt_cast(g, node->inputs[0]->dtype, &gi));
  int rc = tt_accumulate_grad(node->inputs[0], gi);
  tt_tensor_release(gi);
  return rc;
}

/* Records `out` as computed from `in` when autograd is on. On failure releases out. */
static int finish(const char *name, tt_backward_fn bw, tt_tensor *in, tt_tensor *out,
                  tt_node **pnode, tt_tensor **pout) {
  if (pnode) *pnode = NULL;
  if (tt_should_record(&in, 1)) {
    tt_node *node = tt_record(name, bw, out, &in, 1);
    if (!node) {
      tt_tensor_release(out);
      return -1;
    }
    if (pnode) *pnode = node;
  }
  *pout = out;
  return 0;
}

/* -- Views --------------------------------------------------------------------------- */

/* Strides that show t's elements, in row-major order, as `shape` without moving them:
** 1 and stride[] filled when they exist, else 0. The dims of t fall into runs in which
** each dim steps over exactly the next one's extent (memory-contiguous among themselves);
** every run must be re-split into whole dims of `shape`, which then step through the run
** at its innermost stride. */
static int view_strides(const tt_tensor *t, const int64_t *shape, int ndim, int64_t *stride) {
  if (t->ndim == 0 || tt_tensor_numel(t) == 0) return 0;
  int vd = ndim - 1;
  int64_t base = t->stride[t->ndim - 1], run = 1, covered = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    run *= t->shape[d];
    const int run_ends = d == 0 || (t->shape[d - 1] != 1 && t->stride[d - 1] != run * base);
    if (!run_ends) continue;
    while (vd >= 0 && (covered < run || shape[vd] == 1)) {
      stride[vd] = covered * base;
      covered *= shape[vd];
      vd--;
    }
    if (covered != run) return 0;
    if (d > 0) {
      base = t->stride[d - 1];
      run = covered = 1;
    }
  }
  return vd == -1;
}

static int view_impl(const char *op, int keep_strides, tt_tensor *t, const int64_t *shape,
                     int ndim, tt_tensor **out);

int tt_view(tt_tensor *t, const int64_t *shape, int ndim, tt_tensor **out) {
  return view_impl("view", 0, t, shape, ndim, out);
}

int tt_reshape(tt_tensor *t, const int64_t *shape, int ndim, tt_tensor **out) {
  return view_impl("reshape", 1, t, shape, ndim, out);
}

/* keep_strides: a strided view when t's strides allow one (tt_reshape); otherwise, or
** when they do not, the view of a contiguous t or of a contiguous copy (tt_view). */
static int view_impl(const char *op, int keep_strides, tt_tensor *t, const int64_t *shape,
                     int ndim, tt_tensor **out) {
  char a[160], b[160];
  (void)op;
  TT_CHECK(ndim >= 0 && ndim <= TT_MAX_DIMS, "view: %d dims, at most %d", ndim, TT_MAX_DIMS);
  int64_t want[TT_MAX_DIMS], known, n = tt_tensor_numel(t);
  int infer = -1;
  for (int i = 0; i < ndim; i++) {
    want[i] = shape[i];
    if (shape[i] == -1) {
      TT_CHECK(infer < 0, "view: only one dimension can be -1 in %s",
               tt_shape_str(shape, ndim, a, sizeof a));
      infer = i;
      want[i] = 1;
    } else {
      TT_CHECK(shape[i] >= 0, "view: negative size in %s", tt_shape_str(shape, ndim, a, sizeof a));
    }
  }
  /* Checked: a product that wraps could equal n (0 for an empty tensor). With the -1 dim
  ** taken as 1, known is the product of the others; filling the -1 in gives n elements and
  ** strides of at most max(n, known), so the final shape needs no second check. */
  if (tt_shape_numel_checked("view", want, ndim, &known) != 0)
    return tt_set_error("view: shape %s is too large (its element count overflows 64 bits)",
                        tt_shape_str(shape, ndim, a, sizeof a));
  if (infer >= 0) {
    TT_CHECK(known > 0 && n % known == 0, "view: cannot infer -1 in %s for %lld elements",
             tt_shape_str(shape, ndim, a, sizeof a), (long long)n);
    want[infer] = n / known;
    known = n;
  }
  TT_CHECK(known == n, "view: shape %s has %lld elements, tensor %s has %lld",
           tt_shape_str(want, ndim, a, sizeof a), (long long)known,
           tt_shape_str(t->shape, t->ndim, b, sizeof b), (long long)n);
  int64_t strides[TT_MAX_DIMS];
  if (keep_strides && !tt_tensor_is_contiguous(t) && view_strides(t, want, ndim, strides)) {
    tt_tensor *v = tt_tensor_header_alias(t);
    if (!v) return -1;
    v->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
      v->shape[i] = want[i];
      v->stride[i] = strides[i];
    }
    return finish("view", view_backward, t, v, NULL, out);
  }
  tt_tensor *base = NULL;
  /* Not viewable without a copy: reshape semantics, through a contiguous copy. */
  TT_TRY(tt_contiguous(t, &base));
  tt_tensor *v = tt_tensor_header_alias(base);
  if (!v) {
    tt_tensor_release(base);
    return -1;
  }
  v->ndim = ndim;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    v->shape[i] = want[i];
    v->stride[i] = stride;
    stride *= want[i];
  }
  int rc = finish("view", view_backward, base, v, NULL, out);
  tt_tensor_release(base);
  return rc;
}

int tt_transpose(tt_tensor *t, int dim0, int dim1, tt_tensor **out) {
  int d0, d1;
  TT_TRY(tt_norm_dim("transpose", dim0, t->ndim, &d0));
  TT_TRY(tt_norm_dim("transpose", dim1, t->ndim, &d1));
  tt_tensor *v = tt_tensor_header_alias(t);
  if (!v) return -1;
  int64_t s = v->shape[d0], st = v->stride[d0];
  v->shape[d0] = v->shape[d1];
  v->stride[d0] = v->stride[d1];
  v->shape[d1] = s;
  v->stride[d1] = st;
  tt_node *node;
  TT_TRY(finish("transpose", transpose_backward, t, v, &node, out));
  if (node) {
    node->i[0] = d0;
    node->i[1] = d1;
  }
  return 0;
}

int tt_permute(tt_tensor *t, const int *dims, int ndim, tt_tensor **out) {
  TT_CHECK(ndim == t->ndim, "permute: %d dims given for a %d-dim tensor", ndim, t->ndim);
  int seen[TT_MAX_DIMS] = {0}, norm[TT_MAX_DIMS] = {0};
  for (int i = 0; i < ndim; i++) {
    TT_TRY(tt_norm_dim("permute", dims[i], ndim, &norm[i]));
    TT_CHECK(!seen[norm[i]], "permute: dim %d repeated", norm[i]);
    seen[norm[i]] = 1;
  }
  tt_tensor *v = tt_tensor_header_alias(t);
  if (!v) return -1;
  for (int i = 0; i < ndim; i++) {
    v->shape[i] = t->shape[norm[i]];
    v->stride[i] = t->stride[norm[i]];
  }
  tt_node *node;
  TT_TRY(finish("permute", permute_backward, t, v, &node, out));
  if (node)
    for (int i = 0; i < ndim; i++) node->i[i] = norm[i];
  return 0;
}

int tt_narrow(tt_tensor *t, int dim, int64_t start, int64_t length, tt_tensor **out) {
  int d;
  TT_TRY(tt_norm_dim("narrow", dim, t->ndim, &d));
  TT_CHECK(start >= 0 && length >= 0 && start + length <= t->shape[d],
           "narrow: range [%lld, %lld) out of bounds for dim %d of size %lld", (long long)start,
           (long long)(start + length), d, (long long)t->shape[d]);
  tt_tensor *v = tt_tensor_header_alias(t);
  if (!v) return -1;
  v->offset += start * t->stride[d];
  v->shape[d] = length;
  tt_node *node;
  TT_TRY(finish("narrow", narrow_backward, t, v, &node, out));
  if (node) {
    node->i[0] = d;
    node->i[1] = start;
    node->i[2] = length;
  }
  return 0;
}

int tt_expand(tt_tensor *t, const int64_t *shape, int ndim, tt_tensor **out) {
  char a[160], b[160];
  TT_CHECK(ndim >= t->ndim && ndim <= TT_MAX_DIMS, "expand: cannot expand %s to %d dims",
           tt_shape_str(t->shape, t->ndim, a, sizeof a), ndim);
  tt_tensor *v = tt_tensor_header_alias(t);
  if (!v) return -1;
  int lead = ndim - t->ndim;
  v->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    int64_t want = shape[i];
    if (i < lead) {
      if (want < 0) goto bad;
      v->shape[i] = want;
      v->stride[i] = 0;
      continue;
    }
    int64_t have = t->shape[i - lead];
    if (want == -1 || want == have) {
      v->shape[i] = have;
      v->stride[i] = t->stride[i - lead];
    } else if (have == 1 && want >= 0) {
      v->shape[i] = want;
      v->stride[i] = 0;
    } else {
      goto bad;
    }
  }
  /* Expanded dims have stride 0, but the element count must still fit in int64. */
  int64_t numel;
  if (tt_shape_numel_checked("expand", v->shape, ndim, &numel) != 0) {
    tt_tensor_release(v);
    return -1;
  }
  return finish("expand", expand_backward, t, v, NULL, out);
bad:
  tt_tensor_release(v);
  return tt_set_error("expand: cannot expand %s to %s (only size-1 dims can grow)",
                      tt_shape_str(t->shape, t->ndim, a, sizeof a),
                      tt_shape_str(shape, ndim, b, sizeof b));
}

/* -- Copies -------------------------------------------------------------------------- */

int tt_clone(tt_tensor *t, tt_tensor **out) {
  tt_tensor *c = NULL;
  TT_TRY(tt_empty_like(t, &c));
  if (tt_copy_(c, t) != 0) {
    tt_tensor_release(c);
    return -1;
  }
  return finish("clone", identity_backward, t, c, NULL, out);
}

int tt_contiguous(tt_tensor *t, tt_tensor **out) {
  if (tt_tensor_is_contiguous(t)) {
    tt_tensor_retain(t);
    *out = t;
    return 0;
  }
  return tt_clone(t, out);
}

int tt_cast(tt_tensor *t, int dtype, tt_tensor **out) {
  TT_CHECK(dtype >= 0 && dtype < TT_NUM_DTYPES, "cast: unknown dtype %d", dtype);
  tt_tensor *c = NULL;
  TT_TRY(tt_tensor_empty(t->shape, t->ndim, dtype, t->device, &c));
  if (tt_copy_(c, t) != 0) {
    tt_tensor_release(c);
    return -1;
  }
  /* Only float-to-float casts carry gradients. */
  if (!tt_dtype_is_float(dtype) || !tt_dtype_is_float(t->dtype)) {
    *out = c;
    return 0;
  }
  return finish("cast", cast_backward, t, c, NULL, out);
}

/* -- Small helpers used by every op -------------------------------------------------- */

int tt_norm_dim(const char *op, int dim, int ndim, int *out) {
  int d = dim < 0 ? dim + ndim : dim;
  *out = 0;   /* defined even on failure */
  TT_CHECK(d >= 0 && d < ndim, "%s: dim %d out of range for a %d-dim tensor", op, dim, ndim);
  *out = d;
  return 0;
}

int tt_broadcast_shape(const char *op, const tt_tensor *a, const tt_tensor *b, int64_t *shape,
                       int *ndim) {
  char sa[160], sb[160];
  int n = a->ndim > b->ndim ? a->ndim : b->ndim;
  for (int i = 0; i < n; i++) {
    int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
    int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    TT_CHECK(da == db || da == 1 || db == 1,
             "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
             tt_shape_str(a->shape, a->ndim, sa, sizeof sa),
             tt_shape_str(b->shape, b->ndim, sb, sizeof sb), i, (long long)da, (long long)db);
    shape[i] = da == 1 ? db : da;
  }
  *ndim = n;
  return 0;
}

int tt_check_same_device(const char *op, tt_tensor *const *ts, int n) {
  int dev = 0, have = 0;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (!have) {
      dev = ts[i]->device;
      have = 1;
    } else {
      TT_CHECK(ts[i]->device == dev, "%s: tensors on different devices (%d and %d); move them "
               "to one device first", op, dev, ts[i]->device);
    }
  }
  return 0;
}

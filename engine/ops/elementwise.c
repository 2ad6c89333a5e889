/*
** elementwise.c — add, sub, mul, div (numpy broadcasting), scale and add-scalar (the
** in-place axpy that gradient accumulation needs is in core/grad.c).
**
** Binary ops read their inputs through broadcast strides (kernels/elementwise.h), so
** strided and expanded inputs cost no copy. Backward computes full-shape gradients and
** sums them back to each input's shape with tt_reduce_to_shape.
*/
#include "elementwise.h"
#include "core/tt_internal.h"
#include "core/grad.h"

/* -- Helpers ------------------------------------------------------------------------- */

static int ew_table(const char *op, int device, const tt_elementwise_kernels **pk) {
  const tt_elementwise_kernels *k = TT_KERNELS(tt_elementwise, device);
  if (!k) return tt_no_kernel(op, device);
  *pk = k;
  return 0;
}

static int check_f32(const char *op, const char *arg, const tt_tensor *t) {
  if (!t) return tt_set_error("%s: %s is NULL", op, arg);
  return tt_check_dtype(op, arg, t, TT_F32);
}

/* Accumulates g (broadcast to some bigger shape) into input t's gradient, negated when
** `negate`. */
static int accumulate_reduced(const tt_elementwise_kernels *k, tt_tensor *t, tt_tensor *g,
                              int negate) {
  tt_tensor *r = NULL, *rc = NULL, *neg = NULL;
  int st = tt_reduce_to_shape(g, t->shape, t->ndim, &r);
  if (st == 0 && negate) {
    st = tt_contiguous_nograd(r, &rc);
    if (st == 0) st = tt_empty_like(rc, &neg);
    if (st == 0)
      st = k->affine(tt_tensor_data(neg), tt_tensor_data(rc), tt_tensor_numel(rc), -1.0f, 0.0f);
  }
  if (st == 0) st = tt_accumulate_grad(t, negate ? neg : r);
  tt_tensor_release(neg);
  tt_tensor_release(rc);
  tt_tensor_release(r);
  return st;
}

/* -- Binary ops ---------------------------------------------------------------------- */

static const char *const binary_names[4] = {"tt_add", "tt_sub", "tt_mul", "tt_div"};

static int binary_backward(tt_node *node, tt_tensor *g) {
  const int op = (int)node->i[0];
  tt_tensor *a = node->inputs[0], *b = node->inputs[1];
  const int need_a = tt_needs_grad(a), need_b = tt_needs_grad(b);
  const tt_elementwise_kernels *k = NULL;
  TT_TRY(ew_table(binary_names[op], g->device, &k));
  if (op == TT_BINARY_ADD || op == TT_BINARY_SUB) {
    if (need_a) TT_TRY(accumulate_reduced(k, a, g, 0));
    if (need_b) TT_TRY(accumulate_reduced(k, b, g, op == TT_BINARY_SUB));
    return 0;
  }
  if (!k->binary_backward) return tt_no_kernel(binary_names[op], g->device);
  tt_tensor *gc = NULL, *ga = NULL, *gb = NULL;
  int st = tt_contiguous_nograd(g, &gc);
  if (st == 0 && need_a) st = tt_empty_like(gc, &ga);
  if (st == 0 && need_b) st = tt_empty_like(gc, &gb);
  if (st == 0) {
    tt_bcast bc;
    tt_bcast_build(&bc, gc->shape, gc->ndim, a, b);
    st = k->binary_backward(op, ga ? tt_tensor_data(ga) : NULL, gb ? tt_tensor_data(gb) : NULL,
                            tt_tensor_data(gc), tt_tensor_data(a), tt_tensor_data(b), &bc);
  }
  if (st == 0 && need_a) st = accumulate_reduced(k, a, ga, 0);
  if (st == 0 && need_b) st = accumulate_reduced(k, b, gb, 0);
  tt_tensor_release(gb);
  tt_tensor_release(ga);
  tt_tensor_release(gc);
  return st;
}

static int binary_op(int op, tt_tensor *a, tt_tensor *b, tt_tensor **out) {
  const char *name = binary_names[op];
  if (!out) return tt_set_error("%s: out is NULL", name);
  *out = NULL;
  TT_TRY(check_f32(name, "a", a));
  TT_TRY(check_f32(name, "b", b));
  tt_tensor *in[2] = {a, b};
  TT_TRY(tt_check_same_device(name, in, 2));
  int64_t shape[TT_MAX_DIMS];
  int ndim = 0;
  TT_TRY(tt_broadcast_shape(name, a, b, shape, &ndim));
  const tt_elementwise_kernels *k = NULL;
  TT_TRY(ew_table(name, a->device, &k));
  if (!k->binary) return tt_no_kernel(name, a->device);

  tt_tensor *o = NULL;
  TT_TRY(tt_tensor_empty(shape, ndim, TT_F32, a->device, &o));
  if (tt_tensor_numel(o) > 0) {
    tt_bcast bc;
    tt_bcast_build(&bc, shape, ndim, a, b);
    if (k->binary(op, tt_tensor_data(o), tt_tensor_data(a), tt_tensor_data(b), &bc) != 0) {
      tt_tensor_release(o);
      return -1;
    }
  }
  if (tt_should_record(in, 2)) {
    tt_node *node = tt_record(name, binary_backward, o, in, 2);
    if (!node) {
      tt_tensor_release(o);
      return -1;
    }
    node->i[0] = op;
  }
  *out = o;
  return 0;
}

int tt_add(tt_tensor *a, tt_tensor *b, tt_tensor **out) {
  return binary_op(TT_BINARY_ADD, a, b, out);
}
int tt_sub(tt_tensor *a, tt_tensor *b, tt_tensor **out) {
  return binary_op(TT_BINARY_SUB, a, b, out);
}
int tt_mul(tt_tensor *a, tt_tensor *b, tt_tensor **out) {
  return binary_op(TT_BINARY_MUL, a, b, out);
}
int tt_div(tt_tensor *a, tt_tensor *b, tt_tensor **out) {
  return binary_op(TT_BINARY_DIV, a, b, out);
}

/* -- Scale and add-scalar ------------------------------------------------------------ */

/* out = a * s (add = 0) or a + s (s in add). i[0] = 1 marks scale for the backward. */
static int affine_backward(tt_node *node, tt_tensor *g) {
  tt_tensor *a = node->inputs[0];
  if (!node->i[0]) return tt_accumulate_grad(a, g);
  const tt_elementwise_kernels *k = NULL;
  TT_TRY(ew_table("tt_scale", g->device, &k));
  tt_tensor *gc = NULL, *ga = NULL;
  int st = tt_contiguous_nograd(g, &gc);
  if (st == 0) st = tt_empty_like(gc, &ga);
  if (st == 0)
    st = k->affine(tt_tensor_data(ga), tt_tensor_data(gc), tt_tensor_numel(gc),
                   (float)node->f[0], 0.0f);
  if (st == 0) st = tt_accumulate_grad(a, ga);
  tt_tensor_release(ga);
  tt_tensor_release(gc);
  return st;
}

static int affine_op(const char *name, int is_scale, tt_tensor *a, double s, tt_tensor **out) {
  if (!out) return tt_set_error("%s: out is NULL", name);
  *out = NULL;
  TT_TRY(check_f32(name, "a", a));
  const tt_elementwise_kernels *k = NULL;
  TT_TRY(ew_table(name, a->device, &k));
  if (!k->affine) return tt_no_kernel(name, a->device);
  tt_tensor *ac = NULL, *o = NULL;
  TT_TRY(tt_contiguous_nograd(a, &ac));
  int st = tt_empty_like(ac, &o);
  if (st == 0)
    st = k->affine(tt_tensor_data(o), tt_tensor_data(ac), tt_tensor_numel(ac),
                   is_scale ? (float)s : 1.0f, is_scale ? 0.0f : (float)s);
  tt_tensor_release(ac);
  if (st == 0 && tt_should_record(&a, 1)) {
    tt_node *node = tt_record(name, affine_backward, o, &a, 1);
    if (!node) st = -1;
    else {
      node->i[0] = is_scale;
      node->f[0] = s;
    }
  }
  if (st != 0) {
    tt_tensor_release(o);
    return -1;
  }
  *out = o;
  return 0;
}

int tt_scale(tt_tensor *a, double s, tt_tensor **out) {
  return affine_op("tt_scale", 1, a, s, out);
}
int tt_add_scalar(tt_tensor *a, double s, tt_tensor **out) {
  return affine_op("tt_add_scalar", 0, a, s, out);
}

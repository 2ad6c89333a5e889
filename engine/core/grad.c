/*
** grad.c — the sums gradients need: tt_axpy_ (a += alpha b, how a second contribution
** joins a gradient) and tt_reduce_to_shape (a broadcast gradient summed back to its
** input's shape), with the broadcast and reduction plans the elementwise and reduce ops
** share. They live in core, below the ops, so that autograd and the views' backward never
** call up into ops/.
*/
#include "core/grad.h"

/* -- Broadcasts ---------------------------------------------------------------------- */

/* Stride of tensor t along output dim d of an ndim-dim broadcast (0 where t is
** broadcast: missing leading dim or size 1). */
static int64_t bcast_stride(const tt_tensor *t, int ndim, int d) {
  const int dt = d - (ndim - t->ndim);
  if (dt < 0 || t->shape[dt] == 1) return 0;
  return t->stride[dt];
}

void tt_bcast_build(tt_bcast *bc, const int64_t *shape, int ndim, const tt_tensor *a,
                    const tt_tensor *b) {
  int n = 0;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue;
    const int64_t sa = bcast_stride(a, ndim, d), sb = bcast_stride(b, ndim, d);
    if (n > 0 && bc->stride_a[n - 1] == sa * shape[d] && bc->stride_b[n - 1] == sb * shape[d]) {
      bc->shape[n - 1] *= shape[d];
      bc->stride_a[n - 1] = sa;
      bc->stride_b[n - 1] = sb;
      continue;
    }
    bc->shape[n] = shape[d];
    bc->stride_a[n] = sa;
    bc->stride_b[n] = sb;
    n++;
  }
  if (n == 0) {
    bc->shape[0] = 1;
    bc->stride_a[0] = 0;
    bc->stride_b[0] = 0;
    n = 1;
  }
  bc->ndim = n;
}

/* -- Reduction plans ----------------------------------------------------------------- */

void tt_reduce_plan_build(const tt_tensor *x, const int *reduced, tt_reduce_plan *p) {
  int first = -1, last = -1, adjacent = 1;
  for (int d = 0; d < x->ndim; d++) {
    if (!reduced[d] || x->shape[d] == 1) continue;
    if (first < 0) first = d;
    last = d;
  }
  for (int d = first + 1; first >= 0 && d < last; d++)
    if (!reduced[d] && x->shape[d] != 1) adjacent = 0;
  p->outer = p->r = p->inner = 1;
  p->permuted = !adjacent;
  if (adjacent) {
    for (int d = 0; d < x->ndim; d++) {
      if (reduced[d]) p->r *= x->shape[d];
      else if (first < 0 || d < first) p->outer *= x->shape[d];
      else p->inner *= x->shape[d];
    }
    return;
  }
  int n = 0;
  for (int d = 0; d < x->ndim; d++)
    if (!reduced[d]) {
      p->perm[n++] = d;
      p->outer *= x->shape[d];
    }
  for (int d = 0; d < x->ndim; d++)
    if (reduced[d]) {
      p->perm[n++] = d;
      p->r *= x->shape[d];
    }
}

int tt_reduce_plan_input(tt_tensor *x, const tt_reduce_plan *p, tt_tensor **out) {
  if (!p->permuted) return tt_contiguous_nograd(x, out);
  tt_tensor *v = tt_tensor_header_alias(x);
  if (!v) return -1;
  for (int d = 0; d < x->ndim; d++) {
    v->shape[d] = x->shape[p->perm[d]];
    v->stride[d] = x->stride[p->perm[d]];
  }
  int st = tt_contiguous_nograd(v, out);
  tt_tensor_release(v);
  return st;
}

int tt_reduce_plan_sum(const char *op, tt_tensor *x, const tt_reduce_plan *p, float scale,
                       tt_tensor *out) {
  const tt_reduce_kernels *k = TT_KERNELS(tt_reduce, x->device);
  if (!k || !k->sum) return tt_no_kernel(op, x->device);
  if (tt_tensor_numel(out) == 0) return 0;
  tt_tensor *xin = NULL;
  TT_TRY(tt_reduce_plan_input(x, p, &xin));
  int st = k->sum(tt_tensor_data(out), tt_tensor_data(xin), p->outer, p->r, p->inner, scale);
  tt_tensor_release(xin);
  return st;
}

int tt_reduce_to_shape(tt_tensor *g, const int64_t *shape, int ndim, tt_tensor **out) {
  char sg[160], ss[160];
  *out = NULL;
  const int lead = g->ndim - ndim;
  int same = lead == 0, ok = lead >= 0;
  for (int d = 0; ok && d < ndim; d++) {
    const int64_t gd = g->shape[lead + d];
    ok = shape[d] == gd || shape[d] == 1;
    same = same && shape[d] == gd;
  }
  if (!ok)
    return tt_set_error("reduce_to_shape: gradient of shape %s does not broadcast from %s",
                        tt_shape_str(g->shape, g->ndim, sg, sizeof sg),
                        tt_shape_str(shape, ndim, ss, sizeof ss));
  if (same) {
    tt_tensor_retain(g);
    *out = g;
    return 0;
  }
  TT_TRY(tt_check_dtype("reduce_to_shape", "gradient", g, TT_F32));
  int reduced[TT_MAX_DIMS];
  for (int d = 0; d < g->ndim; d++)
    reduced[d] = d < lead || (shape[d - lead] == 1 && g->shape[d] != 1);
  tt_reduce_plan p;
  tt_reduce_plan_build(g, reduced, &p);
  tt_tensor *o = NULL;
  TT_TRY(tt_tensor_empty(shape, ndim, TT_F32, g->device, &o));
  if (tt_reduce_plan_sum("reduce_to_shape", g, &p, 1.0f, o) != 0) {
    tt_tensor_release(o);
    return -1;
  }
  *out = o;
  return 0;
}

/* -- axpy ---------------------------------------------------------------------------- */

static int is_half(int dtype) { return dtype == TT_BF16 || dtype == TT_F16; }

/* a += alpha * b where a or b is bf16 / f16 (a low-precision activation's gradient
** receiving its second contribution): the sum in f32, rounded once into a. Contiguous
** operands on one device take the kernel's one pass (kernels/elementwise.h axpy_half);
** others, and an f32 a, widen to f32, add there and copy back. */
static int axpy_half(tt_tensor *a, double alpha, const tt_tensor *b) {
  const tt_elementwise_kernels *k = TT_KERNELS(tt_elementwise, a->device);
  if (k && k->axpy_half && a->device == b->device && is_half(a->dtype) &&
      (b->dtype == a->dtype || b->dtype == TT_F32) && tt_tensor_is_contiguous(a) &&
      tt_tensor_is_contiguous(b)) {
    a->storage->version++;
    return k->axpy_half(tt_tensor_data(a), a->dtype, (float)alpha,
                        tt_tensor_data((tt_tensor *)b), b->dtype, tt_tensor_numel(a));
  }
  tt_tensor *a32 = NULL, *b32 = NULL;
  int st = tt_tensor_empty(a->shape, a->ndim, TT_F32, a->device, &a32);
  if (st == 0) st = tt_copy_(a32, a);
  if (st == 0 && b->dtype != TT_F32) {
    st = tt_tensor_empty(b->shape, b->ndim, TT_F32, b->device, &b32);
    if (st == 0) st = tt_copy_(b32, b);
  }
  if (st == 0) st = tt_axpy_(a32, alpha, b32 ? b32 : b);
  if (st == 0) st = tt_copy_(a, a32);
  tt_tensor_release(b32);
  tt_tensor_release(a32);
  return st;
}

int tt_axpy_(tt_tensor *a, double alpha, const tt_tensor *b) {
  TT_CHECK(a && b, "tt_axpy_: %s is NULL", a ? "b" : "a");
  if ((is_half(a->dtype) || is_half(b->dtype)) && (is_half(a->dtype) || a->dtype == TT_F32) &&
      (is_half(b->dtype) || b->dtype == TT_F32) && a->ndim == b->ndim &&
      memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0)
    return axpy_half(a, alpha, b);
  TT_TRY(tt_check_dtype("tt_axpy_", "a", a, TT_F32));
  TT_TRY(tt_check_dtype("tt_axpy_", "b", b, TT_F32));
  if (a->device != b->device)
    return tt_set_error("tt_axpy_: a is on device %d but b on device %d", a->device,
                        b->device);
  int same = a->ndim == b->ndim;
  for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
  if (!same) {
    char sa[128], sb[128];
    return tt_set_error("tt_axpy_: a is %s but b is %s; expected the same shape",
                        tt_shape_str(a->shape, a->ndim, sa, sizeof sa),
                        tt_shape_str(b->shape, b->ndim, sb, sizeof sb));
  }
  const tt_elementwise_kernels *k = TT_KERNELS(tt_elementwise, a->device);
  a->storage->version++;
  if (!k || !k->axpy) return tt_no_kernel("tt_axpy_", a->device);
  if (tt_tensor_numel(a) == 0) return 0;

  /* The kernel updates a contiguous destination; a strided `a` goes through a copy. */
  tt_tensor *dst = NULL;
  TT_TRY(tt_contiguous_nograd(a, &dst));
  tt_bcast bc;
  tt_bcast_build(&bc, a->shape, a->ndim, dst, b);
  int st = k->axpy(tt_tensor_data(dst), (float)alpha, tt_tensor_data(b), &bc);
  if (st == 0 && dst != a) st = tt_copy_(a, dst);
  tt_tensor_release(dst);
  return st;
}

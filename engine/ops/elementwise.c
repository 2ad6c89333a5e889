/*
** ops_elementwise.c — add, sub, mul, div (numpy broadcasting), scale, add-scalar and the
** in-place axpy used by optimizers and gradient accumulation.
**
** Binary ops read their inputs through broadcast strides (kernels/elementwise.h), so
** strided and expanded inputs cost no copy. Backward computes full-shape gradients and
** sums them back to each input's shape with tt_reduce_to_shape.
*/
#include "elementwise.h"
#include "core/tt_internal.h"

/* -- Helpers ------------------------------------------------------------------------- */

static int ew_table(const char *op, int device, const tt_elementwise_kernels **pk) {
  const tt_elementwise_kernels *k = TT_KERNELS(tt_elementwise, device);
  if (!k) return tt_no_kernel(op, device);
  *pk = k;
  return 0;
}

/* Stride of tensor t along output dim d of an ndim-dim broadcast (0 where t is
** broadcast: missing leading dim or size 1). */
static int64_t bcast_stride(const tt_tensor *t, int ndim, int d) {
  const int dt = d - (ndim - t->ndim);
  if (dt < 0 || t->shape[dt] == 1) return 0;
  return t->stride[dt];
}

/* Describes out (shape, contiguous) = f(a, b) for the kernels, with size-1 dims dropped
** and neighbouring dims merged wherever both inputs stay uniformly strided. A dense
** same-shape op ends up 1-D. */
static void bcast_build(tt_bcast *bc, const int64_t *shape, int ndim, const tt_tensor *a,
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
    bcast_build(&bc, gc->shape, gc->ndim, a, b);
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
    bcast_build(&bc, shape, ndim, a, b);
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

/* -- axpy ---------------------------------------------------------------------------- */

static int is_half(int dtype) { return dtype == TT_BF16 || dtype == TT_F16; }

/* a += alpha * b where a or b is bf16 / f16 (a low-precision activation's gradient
** receiving its second contribution): the sum in f32, rounded once into a. */
/* axpy_half on the CPU for contiguous operands, in one pass: each element widened, the
** f32 axpy's arithmetic (a + alpha * b), rounded back; the bits of the passes below. */
static int axpy_half_cpu(tt_tensor *a, float alpha, const tt_tensor *b) {
  int64_t n = tt_tensor_numel(a);
  uint16_t *pa = tt_tensor_data(a);
  const void *pb = tt_tensor_data(b);
  int bf = a->dtype == TT_BF16, b32 = b->dtype == TT_F32;
  a->storage->version++;
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    float x = bf ? tt_bf16_to_float(pa[i]) : tt_f16_to_float(pa[i]);
    uint16_t hb = b32 ? 0 : ((const uint16_t *)pb)[i];
    float y = b32 ? ((const float *)pb)[i] : bf ? tt_bf16_to_float(hb) : tt_f16_to_float(hb);
    x += alpha * y;
    pa[i] = bf ? tt_float_to_bf16(x) : tt_float_to_f16(x);
  }
  return 0;
}

static int axpy_half(tt_tensor *a, double alpha, const tt_tensor *b) {
  if (a->device == TT_CPU && b->device == TT_CPU && is_half(a->dtype) &&
      (b->dtype == a->dtype || b->dtype == TT_F32) && tt_tensor_is_contiguous(a) &&
      tt_tensor_is_contiguous(b))
    return axpy_half_cpu(a, (float)alpha, b);
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
  TT_TRY(check_f32("tt_axpy_", "a", a));
  TT_TRY(check_f32("tt_axpy_", "b", b));
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
  const tt_elementwise_kernels *k = NULL;
  TT_TRY(ew_table("tt_axpy_", a->device, &k));
  a->storage->version++;
  if (!k->axpy) return tt_no_kernel("tt_axpy_", a->device);
  if (tt_tensor_numel(a) == 0) return 0;

  /* The kernel updates a contiguous destination; a strided `a` goes through a copy. */
  tt_tensor *dst = NULL;
  TT_TRY(tt_contiguous_nograd(a, &dst));
  tt_bcast bc;
  bcast_build(&bc, a->shape, a->ndim, dst, b);
  int st = k->axpy(tt_tensor_data(dst), (float)alpha, tt_tensor_data(b), &bc);
  if (st == 0 && dst != a) st = tt_copy_(a, dst);
  tt_tensor_release(dst);
  return st;
}

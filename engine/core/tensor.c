/*
** tensor.c — tensor headers, creation, element access, copies, casts and the RNG.
** Views live in view.c, autograd in autograd.c.
*/
#include "core/tt_internal.h"
#include <math.h>
#include <pthread.h>

/* -- Headers ------------------------------------------------------------------------- */

int tt_shape_numel_checked(const char *op, const int64_t *shape, int ndim, int64_t *numel) {
  char buf[160];
  TT_CHECK(ndim >= 0 && ndim <= TT_MAX_DIMS, "%s: %d dims requested, at most %d supported",
           op, ndim, TT_MAX_DIMS);
  /* span is the product of the sizes other than 0: the largest contiguous stride (and the
  ** element count when no size is 0). Checking it, not just the count, keeps the strides
  ** of an empty tensor such as [0, 2^40, 2^40] from overflowing too. */
  int64_t span = 1;
  int empty = 0;
  for (int i = ndim - 1; i >= 0; i--) {
    TT_CHECK(shape[i] >= 0, "%s: negative size %lld in dim %d", op, (long long)shape[i], i);
    empty |= shape[i] == 0;
    TT_CHECK(!__builtin_mul_overflow(span, shape[i] ? shape[i] : 1, &span),
             "%s: shape %s is too large (its element count overflows 64 bits)", op,
             tt_shape_str(shape, ndim, buf, sizeof buf));
  }
  *numel = empty ? 0 : span;
  return 0;
}

/* Bytes of a tensor of `shape` and dtype, checked so that every byte offset fits in int64
** (tt_tensor_data scales element offsets to bytes in int64). */
static int shape_nbytes(const char *op, const int64_t *shape, int ndim, int dtype,
                        size_t *nbytes) {
  char buf[160];
  int64_t numel;
  TT_TRY(tt_shape_numel_checked(op, shape, ndim, &numel));
  TT_CHECK(dtype >= 0 && dtype < TT_NUM_DTYPES, "%s: unknown dtype %d", op, dtype);
  TT_CHECK(numel <= INT64_MAX / (int64_t)tt_dtype_size(dtype),
           "%s: shape %s is too large (%lld %s elements overflow 64 bits of bytes)", op,
           tt_shape_str(shape, ndim, buf, sizeof buf), (long long)numel, tt_dtype_name(dtype));
  *nbytes = (size_t)numel * tt_dtype_size(dtype);
  return 0;
}

/* Lazy random tensors (tetra.h; defined with the generator, below). */
static tt_lazy_init *lazy_of(const tt_storage *s);
static int lazy_snapshot(const tt_storage *s, tt_lazy_init *out);
static void lazy_fill(const tt_lazy_init *z, int64_t first, int64_t n, float *p);
static int lazy_view_values(const tt_tensor *v, const tt_lazy_init *z, tt_tensor **out);
static int lazy_tensor(const tt_lazy_init *z, const int64_t *shape, int ndim, size_t nbytes,
                       int device, tt_tensor **out);

/* A fresh header over `storage` (retained), contiguous strides. */
static tt_tensor *header_new(tt_storage *storage, const int64_t *shape, int ndim, int dtype) {
  tt_tensor *t = calloc(1, sizeof *t);
  if (!t) {
    tt_set_error("out of host memory (tensor header)");
    return NULL;
  }
  t->storage = storage;
  t->device = storage->device;
  t->dtype = dtype;
  t->ndim = ndim;
  t->refcount = 1;
  t->is_leaf = 1;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    t->shape[i] = shape[i];
    t->stride[i] = stride;
    stride *= shape[i];
  }
  return t;
}

tt_tensor *tt_tensor_header_alias(tt_tensor *base) {
  tt_tensor *t = calloc(1, sizeof *t);
  if (!t) {
    tt_set_error("out of host memory (tensor header)");
    return NULL;
  }
  __atomic_add_fetch(&base->storage->refcount, 1, __ATOMIC_RELAXED);
  t->storage = base->storage;
  t->offset = base->offset;
  t->ndim = base->ndim;
  memcpy(t->shape, base->shape, sizeof t->shape);
  memcpy(t->stride, base->stride, sizeof t->stride);
  t->dtype = base->dtype;
  t->device = base->device;
  t->refcount = 1;
  t->is_leaf = 1;
  return t;
}

int64_t tt_shape_numel(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

int tt_tensor_empty(const int64_t *shape, int ndim, int dtype, int device, tt_tensor **out) {
  size_t nbytes;
  TT_TRY(shape_nbytes("empty", shape, ndim, dtype, &nbytes));
  tt_storage *s = tt_storage_new(nbytes, device);
  if (!s) return -1;
  tt_tensor *t = header_new(s, shape, ndim, dtype);
  if (!t) {
    tt_storage_release(s);
    return -1;
  }
  *out = t;
  return 0;
}

int tt_tensor_zeros(const int64_t *shape, int ndim, int dtype, int device, tt_tensor **out) {
  TT_TRY(tt_tensor_empty(shape, ndim, dtype, device, out));
  const tt_device_backend *be = tt_backend_for(device);
  size_t nbytes = (size_t)tt_tensor_numel(*out) * tt_dtype_size(dtype);
  if (!be || be->memset0(tt_tensor_data(*out), device, nbytes) != 0) {
    tt_tensor_release(*out);
    *out = NULL;
    return -1;
  }
  return 0;
}

int tt_tensor_full(const int64_t *shape, int ndim, int dtype, int device, double value,
                   tt_tensor **out) {
  TT_TRY(tt_tensor_empty(shape, ndim, dtype, device, out));
  if (tt_fill_(*out, value) != 0) {
    tt_tensor_release(*out);
    *out = NULL;
    return -1;
  }
  return 0;
}

int tt_tensor_from_buffer(void *data, const int64_t *shape, int ndim, int dtype,
                          tt_tensor **out) {
  size_t nbytes;
  TT_TRY(shape_nbytes("from_buffer", shape, ndim, dtype, &nbytes));
  TT_CHECK(data != NULL, "from_buffer: NULL data");
  tt_storage *s = calloc(1, sizeof *s);
  TT_CHECK(s, "out of host memory (storage header)");
  s->data = data;
  s->nbytes = nbytes;
  s->device = TT_CPU;
  s->refcount = 1;
  s->external = 1;
  tt_tensor *t = header_new(s, shape, ndim, dtype);
  if (!t) {
    free(s);
    return -1;
  }
  *out = t;
  return 0;
}

int tt_tensor_from_f64(const double *values, const int64_t *shape, int ndim, int dtype,
                       tt_tensor **out) {
  TT_TRY(tt_tensor_empty(shape, ndim, dtype, TT_CPU, out));
  if (tt_tensor_copy_from_f64(*out, values) != 0) {
    tt_tensor_release(*out);
    *out = NULL;
    return -1;
  }
  return 0;
}

void tt_tensor_retain(tt_tensor *t) {
  if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
}

void tt_tensor_release(tt_tensor *t) {
  if (!t) return;
  if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  tt_tensor_release(t->grad);
  tt_tensor_release(t->lowp);
  tt_storage_release(t->storage);
  free(t);
}

int64_t tt_tensor_numel(const tt_tensor *t) { return tt_shape_numel(t->shape, t->ndim); }

int tt_tensor_is_contiguous(const tt_tensor *t) {
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != expected) return 0;
    expected *= t->shape[i];
  }
  return 1;
}

void *tt_tensor_data(const tt_tensor *t) {
  /* A lazy tensor is drawn whole when its data is first needed; a failure here has no
  ** caller to report to (the memory a draw needs is what the eager draw took at creation). */
  if (__builtin_expect(__atomic_load_n(&t->storage->lazy, __ATOMIC_ACQUIRE) != NULL, 0) &&
      tt_lazy_materialize(t->storage) != 0) {
    fprintf(stderr, "tetra: cannot draw a lazily initialised tensor of %zu bytes: %s\n",
            t->storage->nbytes, tt_last_error());
    abort();
  }
  return (char *)t->storage->data + t->offset * (int64_t)tt_dtype_size(t->dtype);
}

const char *tt_shape_str(const int64_t *shape, int ndim, char *buf, size_t n) {
  size_t used = 0;
  used += (size_t)snprintf(buf + used, n - used, "[");
  for (int i = 0; i < ndim && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

const char *tt_tensor_describe(const tt_tensor *t, char *buf, size_t n) {
  char shape[160], dev[16];
  if (t->device == TT_CPU) snprintf(dev, sizeof dev, "cpu");
  else snprintf(dev, sizeof dev, "cuda:%d", t->device);
  snprintf(buf, n, "%s%s %s", tt_dtype_name(t->dtype),
           tt_shape_str(t->shape, t->ndim, shape, sizeof shape), dev);
  return buf;
}

/* -- Element access ------------------------------------------------------------------ */

static inline double load_elem(const void *p, int dtype) {
  switch (dtype) {
  case TT_F32: return *(const float *)p;
  case TT_BF16: return tt_bf16_to_float(*(const uint16_t *)p);
  case TT_F16: return tt_f16_to_float(*(const uint16_t *)p);
  case TT_E4M3: case TT_E5M2: return tt_fp8_to_float(*(const uint8_t *)p, dtype);
  case TT_I32: return *(const int32_t *)p;
  case TT_I64: return (double)*(const int64_t *)p;
  default: return 0.0;
  }
}

/* v as a float rounded to odd: when v falls between two floats, the one whose last bit is
** 1. A narrower format (bf16, f16, fp8: at least two bits fewer) rounded to nearest from
** it is then v rounded to nearest once, as the GPU's double-to-bf16 conversion does
** (engine/cuda/copy.cu); plain (float)v would round twice and can land on the other side
** of a tie (an i32 2^24 + 2^16 + 1 became bf16 2^24, not 2^24 + 2^17). Only integers past
** 2^24 are not floats already. */
static inline float float_round_odd(double v) {
  float f = (float)v;
  if ((double)f != v && isfinite(f)) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if (!(bits & 1)) f = nextafterf(f, v > f ? INFINITY : -INFINITY);
  }
  return f;
}

static inline void store_elem(void *p, int dtype, double v) {
  switch (dtype) {
  case TT_F32: *(float *)p = (float)v; break;
  case TT_BF16: *(uint16_t *)p = tt_float_to_bf16(float_round_odd(v)); break;
  case TT_F16: *(uint16_t *)p = tt_float_to_f16(float_round_odd(v)); break;
  case TT_E4M3: case TT_E5M2: *(uint8_t *)p = tt_float_to_fp8(float_round_odd(v), dtype); break;
  case TT_I32: *(int32_t *)p = (int32_t)v; break;
  case TT_I64: *(int64_t *)p = (int64_t)v; break;
  default: break;
  }
}

/* Storage offset (elements) of logical flat index i. */
static inline int64_t flat_to_offset(const tt_tensor *t, int64_t i) {
  int64_t off = t->offset;
  for (int d = t->ndim - 1; d >= 0; d--) {
    int64_t sz = t->shape[d];
    off += (i % sz) * t->stride[d];
    i /= sz;
  }
  return off;
}

static inline void *elem_ptr(const tt_tensor *t, int64_t storage_off) {
  (void)tt_tensor_data(t);   /* a lazy tensor drawn */
  return (char *)t->storage->data + storage_off * (int64_t)tt_dtype_size(t->dtype);
}

/* On a device the element is copied to the host (a wait for the device: for reading a
** loss or a check, not in a loop); it was NaN there, which read every GPU loss that
** F.item took as not finite. NaN for an index out of range or a failed copy. */
double tt_tensor_get(const tt_tensor *t, int64_t i) {
  if (i < 0 || i >= tt_tensor_numel(t)) return NAN;
  if (t->device == TT_CPU) return load_elem(elem_ptr(t, flat_to_offset(t, i)), t->dtype);
  const tt_device_backend *be = tt_backend_for(t->device);
  unsigned char elem[16];
  if (!be || be->memcpy(elem, TT_CPU, elem_ptr(t, flat_to_offset(t, i)), t->device,
                        tt_dtype_size(t->dtype)) != 0)
    return NAN;
  return load_elem(elem, t->dtype);
}

int tt_tensor_set(tt_tensor *t, int64_t i, double v) {
  TT_CHECK(t->device == TT_CPU, "set: tensor is on cuda:%d; copy it to the cpu first",
           t->device);
  TT_CHECK(i >= 0 && i < tt_tensor_numel(t), "set: index %lld out of range for %lld elements",
           (long long)i, (long long)tt_tensor_numel(t));
  store_elem(elem_ptr(t, flat_to_offset(t, i)), t->dtype, v);
  t->storage->version++;
  return 0;
}

int tt_tensor_to_f64(const tt_tensor *t, double *dst) {
  TT_CHECK(t->device == TT_CPU, "to_f64: tensor is on cuda:%d", t->device);
  int64_t n = tt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) dst[i] = load_elem(elem_ptr(t, flat_to_offset(t, i)), t->dtype);
  return 0;
}

int tt_tensor_copy_from_f64(tt_tensor *t, const double *src) {
  TT_CHECK(t->device == TT_CPU, "copy_from_f64: tensor is on cuda:%d", t->device);
  int64_t n = tt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) store_elem(elem_ptr(t, flat_to_offset(t, i)), t->dtype, src[i]);
  t->storage->version++;
  return 0;
}

/* -- Copies and casts ---------------------------------------------------------------- */

/* One innermost row of n elements for the casts a bf16 or fp16 step makes around every
** GEMM (f32 to bf16 / f16 and back): the element loop with the dtypes fixed, so that it
** vectorises, rounding as tt_float_to_bf16 / tt_float_to_f16 do. Returns 0 for the other
** pairs (the generic path below); rows of one dtype are copy_row_bits'. */
static int copy_row_fast(char *dp, int ddt, int64_t dstep, const char *sp, int sdt,
                         int64_t sstep, int64_t n) {
  if (ddt == TT_BF16 && sdt == TT_F32) {
    uint16_t *d = (uint16_t *)dp;
    const float *x = (const float *)sp;
    if (dstep == 1 && sstep == 1)
      for (int64_t j = 0; j < n; j++) d[j] = tt_elem_float_to_bf16(x[j]);
    else
      for (int64_t j = 0; j < n; j++) d[j * dstep] = tt_elem_float_to_bf16(x[j * sstep]);
    return 1;
  }
  if (ddt == TT_F16 && sdt == TT_F32) {   /* fp16's casts likewise */
    uint16_t *d = (uint16_t *)dp;
    const float *x = (const float *)sp;
    for (int64_t j = 0; j < n; j++) d[j * dstep] = tt_elem_float_to_f16(x[j * sstep]);
    return 1;
  }
  if (ddt == TT_F32 && sdt == TT_F16) {
    float *d = (float *)dp;
    const uint16_t *x = (const uint16_t *)sp;
    for (int64_t j = 0; j < n; j++) d[j * dstep] = tt_elem_f16_to_float(x[j * sstep]);
    return 1;
  }
  if (ddt == TT_F32 && sdt == TT_BF16) {
    float *d = (float *)dp;
    const uint16_t *x = (const uint16_t *)sp;
    if (dstep == 1 && sstep == 1)
      for (int64_t j = 0; j < n; j++) d[j] = tt_elem_bf16_to_float(x[j]);
    else
      for (int64_t j = 0; j < n; j++) d[j * dstep] = tt_elem_bf16_to_float(x[j * sstep]);
    return 1;
  }
  return 0;
}

/* A row of n elements of one dtype, `size` bytes each, moved as bits. */
static void copy_row_bits(char *dp, int64_t dstep, const char *sp, int64_t sstep, int64_t n,
                          size_t size) {
  if (dstep == 1 && sstep == 1) {
    memcpy(dp, sp, (size_t)n * size);
    return;
  }
#define TT_ROW_BITS(W)                                                                     \
  for (int64_t j = 0; j < n; j++) ((W *)dp)[j * dstep] = ((const W *)sp)[j * sstep];       \
  return;
  switch (size) {
    case 1: TT_ROW_BITS(uint8_t)
    case 2: TT_ROW_BITS(uint16_t)
    case 4: TT_ROW_BITS(uint32_t)
    default: TT_ROW_BITS(uint64_t)
  }
#undef TT_ROW_BITS
}

/* Copies rows of the innermost dimension. Both tensors have the same shape; `outer`
** rows of `inner` elements each are walked with per-dimension counters. */
static void copy_strided_cpu(tt_tensor *dst, const tt_tensor *src) {
  if (dst->dtype != src->dtype && tt_tensor_is_contiguous(dst) &&
      tt_tensor_is_contiguous(src)) {
    /* A cast between contiguous tensors (the bf16 step's casts around every GEMM): one
    ** flat row, in chunks per thread, so that the loops are long and vectorised. */
    enum { CHUNK = 1 << 14 };
    const int64_t n = tt_tensor_numel(dst), chunks = (n + CHUNK - 1) / CHUNK;
    const size_t dsz = tt_dtype_size(dst->dtype), ssz = tt_dtype_size(src->dtype);
    char *d0 = (char *)dst->storage->data + dst->offset * (int64_t)dsz;
    const char *s0 = (const char *)src->storage->data + src->offset * (int64_t)ssz;
    int fast = 1;
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN) reduction(&& : fast)
    for (int64_t c = 0; c < chunks; c++) {
      const int64_t at = c * CHUNK, len = n - at < CHUNK ? n - at : CHUNK;
      fast = fast && copy_row_fast(d0 + at * (int64_t)dsz, dst->dtype, 1,
                                   s0 + at * (int64_t)ssz, src->dtype, 1, len);
    }
    if (fast) return;   /* else a pair copy_row_fast does not know: the general loop */
  }
  int nd = dst->ndim;
  int64_t inner = nd ? dst->shape[nd - 1] : 1;
  int64_t dstep = nd ? dst->stride[nd - 1] : 1, sstep = nd ? src->stride[nd - 1] : 1;
  int64_t outer = inner ? tt_tensor_numel(dst) / inner : 0;
  /* One dtype: the elements' bits (int64 values above 2^53 would not survive a double). */
  const int same = dst->dtype == src->dtype;
  size_t dsz = tt_dtype_size(dst->dtype), ssz = tt_dtype_size(src->dtype);
#pragma omp parallel for schedule(static) if (outer * inner > TT_PARALLEL_GRAIN)
  for (int64_t r = 0; r < outer; r++) {
    /* Offsets of row r: decompose r over dims 0..nd-2. */
    int64_t doff = dst->offset, soff = src->offset, rem = r;
    for (int d = nd - 2; d >= 0; d--) {
      int64_t idx = rem % dst->shape[d];
      rem /= dst->shape[d];
      doff += idx * dst->stride[d];
      soff += idx * src->stride[d];
    }
    char *dp = (char *)dst->storage->data + doff * (int64_t)dsz;
    const char *sp = (const char *)src->storage->data + soff * (int64_t)ssz;
    if (same) {
      copy_row_bits(dp, dstep, sp, sstep, inner, dsz);
    } else {
      if (copy_row_fast(dp, dst->dtype, dstep, sp, src->dtype, sstep, inner)) continue;
      for (int64_t j = 0; j < inner; j++)
        store_elem(dp + j * dstep * (int64_t)dsz, dst->dtype,
                   load_elem(sp + j * sstep * (int64_t)ssz, src->dtype));
    }
  }
}

int tt_round_f32_(tt_tensor *dst, const tt_tensor *src, int dtype) {
  const int64_t n = tt_tensor_numel(dst);
  TT_CHECK(dst->device == TT_CPU && src->device == TT_CPU && dst->dtype == TT_F32 &&
               src->dtype == TT_F32 && tt_tensor_is_contiguous(dst) &&
               tt_tensor_is_contiguous(src) && tt_tensor_numel(src) == n &&
               (dtype == TT_BF16 || dtype == TT_F16),
           "round_f32: internal error: expected contiguous f32 cpu tensors of %lld elements "
           "and bf16 or f16", (long long)n);
  float *restrict d = tt_tensor_data(dst);
  const float *restrict x = tt_tensor_data((tt_tensor *)src);
  ++dst->storage->version;
  if (dtype == TT_BF16) {
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t j = 0; j < n; j++) d[j] = tt_elem_bf16_to_float(tt_elem_float_to_bf16(x[j]));
  } else {
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t j = 0; j < n; j++) d[j] = tt_elem_f16_to_float(tt_elem_float_to_f16(x[j]));
  }
  return 0;
}

/* A copy between the CPU and a device with strides or a cast on either side (a
** checkpoint's shard narrowed along a row-parallel weight's dim 1, into or out of the
** device's parameter): through contiguous buffers, the whole-buffer transfer in between,
** the strides and the cast on the host where they can be (copy_strided_cpu), and a
** device's own strided copy for a strided device side. */
static int copy_across(tt_tensor *dst, const tt_tensor *src) {
  tt_tensor *dev = NULL, *host = NULL;
  int rc = 0;
  if (dst->device == TT_CPU) {   /* down: the source made contiguous on its device first */
    const tt_tensor *from = src;
    if (!tt_tensor_is_contiguous(src)) {
      rc = tt_tensor_empty(src->shape, src->ndim, src->dtype, src->device, &dev);
      if (rc == 0) rc = tt_copy_(dev, src);
      from = dev;
    }
    if (rc == 0) rc = tt_tensor_empty(src->shape, src->ndim, src->dtype, TT_CPU, &host);
    if (rc == 0) rc = tt_copy_(host, from);
    if (rc == 0) copy_strided_cpu(dst, host);
  } else {                       /* up: cast and packed on the host, unpacked on the device */
    const tt_tensor *from = src;
    if (!tt_tensor_is_contiguous(src) || src->dtype != dst->dtype) {
      rc = tt_tensor_empty(src->shape, src->ndim, dst->dtype, TT_CPU, &host);
      if (rc == 0) copy_strided_cpu(host, src);
      from = host;
    }
    if (rc == 0 && tt_tensor_is_contiguous(dst)) {
      rc = tt_copy_(dst, from);
    } else if (rc == 0) {
      rc = tt_tensor_empty(dst->shape, dst->ndim, dst->dtype, dst->device, &dev);
      if (rc == 0) rc = tt_copy_(dev, from);
      if (rc == 0) rc = tt_copy_(dst, dev);
    }
  }
  tt_tensor_release(dev);
  tt_tensor_release(host);
  return rc == 0 ? 0 : tt_error_context("copy between cpu and cuda");
}

int tt_copy_(tt_tensor *dst, const tt_tensor *src) {
  char a[160], b[160];
  TT_CHECK(dst->ndim == src->ndim &&
               memcmp(dst->shape, src->shape, sizeof(int64_t) * (size_t)dst->ndim) == 0,
           "copy: shape mismatch, destination %s, source %s",
           tt_shape_str(dst->shape, dst->ndim, a, sizeof a),
           tt_shape_str(src->shape, src->ndim, b, sizeof b));
  int64_t n = tt_tensor_numel(dst);
  if (n == 0) return 0;
  TT_TRY(tt_lazy_materialize(dst->storage));
  /* From a lazy tensor only the source view's elements are drawn (straight into dst when
  ** both are plain f32 runs on the host), and the source stays lazy. */
  tt_lazy_init z;
  if (lazy_snapshot(src->storage, &z)) {
    if (dst->device == TT_CPU && dst->dtype == TT_F32 && tt_tensor_is_contiguous(dst) &&
        tt_tensor_is_contiguous(src)) {
      dst->storage->version++;
      lazy_fill(&z, src->offset, n, tt_tensor_data(dst));
      return 0;
    }
    tt_tensor *values = NULL;
    int rc = lazy_view_values(src, &z, &values);
    if (rc == 0) rc = tt_copy_(dst, values);
    tt_tensor_release(values);
    return rc;
  }
  dst->storage->version++;
  if (dst->device == TT_CPU && src->device == TT_CPU) {
    copy_strided_cpu(dst, src);
    return 0;
  }
  /* Whole-buffer copies between devices, or within one device, need no kernel. */
  if (dst->dtype == src->dtype && tt_tensor_is_contiguous(dst) && tt_tensor_is_contiguous(src)) {
    const tt_device_backend *be = tt_backend_for(tt_device_is_cuda(dst->device) ? dst->device
                                                                                 : src->device);
    if (!be) return -1;
    return be->memcpy(tt_tensor_data(dst), dst->device, tt_tensor_data(src), src->device,
                      (size_t)n * tt_dtype_size(dst->dtype));
  }
  if (dst->device == src->device) {
    TT_CHECK(tt_cuda_copy_strided, "copy: strided or casting copy on cuda:%d: this build has "
             "no CUDA copy kernel", dst->device);
    return tt_cuda_copy_strided(dst, src);
  }
  if (dst->device == TT_CPU || src->device == TT_CPU) return copy_across(dst, src);
  return tt_set_error("copy: strided or casting copy between cuda:%d and cuda:%d; make the "
                      "tensor contiguous on its own device first", src->device, dst->device);
}

/* A fill on a GPU by kernels, in stream order: no host wait (backward's seed of ones is a
** fill, and a wait there broke every step's CUDA-graph capture on the first H200 run).
** Zeros of any dtype are a memset; other values of a float dtype an f32 fill, cast by a
** device copy where the dtype or layout differs. 1: not handled here. */
static int fill_device(tt_tensor *t, int64_t n, double value) {
  const tt_device_backend *be = tt_backend_for(t->device);
  if (!be) return -1;
  const int contiguous = tt_tensor_is_contiguous(t);
  if (contiguous && value == 0.0 && !signbit(value)) {
    t->storage->version++;
    return be->memset0(tt_tensor_data(t), t->device, (size_t)n * tt_dtype_size(t->dtype));
  }
  if (!be->fill_f32 || !tt_dtype_is_float(t->dtype)) return 1;
  if (t->dtype == TT_F32 && contiguous) {
    t->storage->version++;
    return be->fill_f32(tt_tensor_data(t), t->device, n, (float)value);
  }
  tt_tensor *f = NULL;
  TT_TRY(tt_tensor_empty(t->shape, t->ndim, TT_F32, t->device, &f));
  int rc = be->fill_f32(tt_tensor_data(f), t->device, n, (float)value);
  if (rc == 0) rc = tt_copy_(t, f);
  tt_tensor_release(f);
  return rc;
}

int tt_fill_(tt_tensor *t, double value) {
  int64_t n = tt_tensor_numel(t);
  if (t->device != TT_CPU) {
    if (n == 0) return 0;
    int rc = fill_device(t, n, value);
    if (rc <= 0) return rc;
    /* Integers other than zero: fill a host buffer and copy it over (initialisation). */
    tt_tensor *host = NULL;
    TT_TRY(tt_tensor_full(t->shape, t->ndim, t->dtype, TT_CPU, value, &host));
    rc = tt_copy_(t, host);
    tt_tensor_release(host);
    return rc;
  }
  t->storage->version++;
  if (t->dtype == TT_F32 && tt_tensor_is_contiguous(t)) {
    float *p = tt_tensor_data(t), v = (float)value;
    for (int64_t i = 0; i < n; i++) p[i] = v;
    return 0;
  }
  for (int64_t i = 0; i < n; i++) store_elem(elem_ptr(t, flat_to_offset(t, i)), t->dtype, value);
  return 0;
}

int tt_empty_like(const tt_tensor *t, tt_tensor **out) {
  return tt_tensor_empty(t->shape, t->ndim, t->dtype, t->device, out);
}

int tt_zeros_like(const tt_tensor *t, tt_tensor **out) {
  return tt_tensor_zeros(t->shape, t->ndim, t->dtype, t->device, out);
}

int tt_contiguous_nograd(tt_tensor *t, tt_tensor **out) {
  if (tt_tensor_is_contiguous(t)) {
    tt_tensor_retain(t);
    *out = t;
    return 0;
  }
  TT_TRY(tt_empty_like(t, out));
  if (tt_copy_(*out, t) != 0) {
    tt_tensor_release(*out);
    *out = NULL;
    return -1;
  }
  return 0;
}

/* The copy joins no autograd tape: to_device is no differentiable op. */
int tt_to_device(tt_tensor *t, int device, tt_tensor **out) {
  if (t->device == device) {
    tt_tensor_retain(t);
    *out = t;
    return 0;
  }
  /* A lazy tensor that is its whole storage stays lazy there: drawn on the host and
  ** uploaded when first read, or only a view's part when copied from (a ZeRO-3 share). */
  tt_lazy_init z;
  if (lazy_snapshot(t->storage, &z) && t->offset == 0 && tt_tensor_is_contiguous(t) &&
      tt_tensor_numel(t) == z.numel && t->dtype == TT_F32 && tt_backend_for(device)) {
    return lazy_tensor(&z, t->shape, t->ndim, t->storage->nbytes, device, out);
  }
  tt_tensor *src = NULL, *dst = NULL;
  TT_TRY(tt_contiguous_nograd(t, &src));
  if (tt_tensor_empty(t->shape, t->ndim, t->dtype, device, &dst) != 0 || tt_copy_(dst, src) != 0) {
    tt_tensor_release(src);
    tt_tensor_release(dst);
    return -1;
  }
  tt_tensor_release(src);
  *out = dst;
  return 0;
}

/* A header of its own over t's storage, outside every tape (no gradient flows through). */
int tt_detach(tt_tensor *t, tt_tensor **out) {
  tt_tensor *v = tt_tensor_header_alias(t);
  if (!v) return -1;
  *out = v;
  return 0;
}

/* -- Argument checks ops share --------------------------------------------------- */

int tt_check_dtype(const char *op, const char *arg, const tt_tensor *t, int dtype) {
  TT_CHECK(t->dtype == dtype, "%s: %s must be %s, got %s", op, arg, tt_dtype_name(dtype),
           tt_dtype_name(t->dtype));
  return 0;
}

int tt_check_float(const char *op, const char *arg, const tt_tensor *t) {
  TT_CHECK(tt_dtype_is_float(t->dtype), "%s: %s must be a float tensor, got %s", op, arg,
           tt_dtype_name(t->dtype));
  return 0;
}

int tt_check_index(const char *op, const char *arg, const tt_tensor *t) {
  TT_CHECK(t->dtype == TT_I32 || t->dtype == TT_I64, "%s: %s must be i32 or i64, got %s", op,
           arg, tt_dtype_name(t->dtype));
  return 0;
}

/* -- Random numbers ------------------------------------------------------------------ */
/* splitmix64: one 64-bit word of state, so checkpoints save and restore it exactly. */

static uint64_t tt_rng = 0x853c49e6748fea9bULL;

/* The seed goes through the splitmix64 finaliser so that nearby seeds give unrelated
** streams (a plain affine map would make seed s+1 the stream of s shifted by one draw). */
void tt_manual_seed(uint64_t seed) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  tt_rng = z ^ (z >> 31);
}
uint64_t tt_rng_state(void) { return tt_rng; }
void tt_rng_set_state(uint64_t state) { tt_rng = state; }

/* splitmix64's k-th output after `state` depends on k alone (the state only adds a
** constant per draw), so a tensor's draws can be made by many threads at once, each from
** its own position, and give the bits one thread would. */
static inline uint64_t rng_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
static inline uint64_t rng_at(uint64_t state, uint64_t k) {   /* draw k (from 0) */
  return rng_mix(state + (k + 1) * 0x9e3779b97f4a7c15ULL);
}

static uint64_t rng_next(void) { return rng_mix(tt_rng += 0x9e3779b97f4a7c15ULL); }

/* Uniform in (0, 1): 53 random bits, never exactly 0 (safe for log). */
static inline double rng_unit(uint64_t bits) { return ((double)(bits >> 11) + 0.5) * 0x1.0p-53; }

/* Elements [first, first + n) of the draws z describes, into p (f32). Normals go by
** Box-Muller, both outputs used: pair k takes draws 2k and 2k + 1 and gives elements 2k
** (cos) and 2k + 1 (sin), so any range gives the bits the whole tensor's draw has there.
** Initialising a billion-parameter model draws a billion normals: at about 45 M/s on one
** core that was 25 s before the first step (the first H200 run), hence the threads. */
static void lazy_fill(const tt_lazy_init *z, int64_t first, int64_t n, float *p) {
  const uint64_t s = z->state;
  if (z->kind == TT_LAZY_ZEROS) {
    memset(p, 0, (size_t)n * sizeof(float));
    return;
  }
  if (z->kind == TT_LAZY_UNIFORM) {
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t i = 0; i < n; i++)
      p[i] = (float)(z->a + (z->b - z->a) * rng_unit(rng_at(s, (uint64_t)(first + i))));
    return;
  }
  const int64_t k0 = first / 2, k1 = (first + n - 1) / 2;
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t k = k0; k <= k1; k++) {
    double r = sqrt(-2.0 * log(rng_unit(rng_at(s, 2 * (uint64_t)k)))),
           a = 2.0 * M_PI * rng_unit(rng_at(s, 2 * (uint64_t)k + 1));
    if (2 * k >= first) p[2 * k - first] = (float)(z->a + z->b * r * cos(a));
    if (2 * k + 1 < first + n) p[2 * k + 1 - first] = (float)(z->a + z->b * r * sin(a));
  }
}

/* A new f32 tensor on `device` whose storage (nbytes) holds z's draws, not made yet. */
static int lazy_tensor(const tt_lazy_init *z, const int64_t *shape, int ndim, size_t nbytes,
                       int device, tt_tensor **out) {
  tt_storage *st = calloc(1, sizeof *st);
  tt_lazy_init *lz = malloc(sizeof *lz);
  if (st && lz) {
    *lz = *z;
    st->nbytes = nbytes;
    st->device = device;
    st->refcount = 1;
    st->lazy = lz;
  }
  tt_tensor *t = st && lz ? header_new(st, shape, ndim, TT_F32) : NULL;
  if (!t) {
    free(st);
    free(lz);
    return tt_set_error("out of host memory (a tensor's header)");
  }
  *out = t;
  return 0;
}

static int lazy_on = 1;
int tt_set_lazy_init(int on) {
  int was = lazy_on;
  lazy_on = on != 0;
  return was;
}

/* A new f32 CPU tensor of n draws from the generator (normal or uniform in a, b): lazy
** (tetra.h), or drawn now. The generator advances by the draws either way. */
static int random_tensor(const int64_t *shape, int ndim, int normal, double a, double b,
                         tt_tensor **out) {
  int64_t n;
  TT_TRY(tt_shape_numel_checked(normal ? "randn" : "rand", shape, ndim, &n));
  size_t nbytes = (size_t)n * sizeof(float);
  const tt_lazy_init z = {normal ? TT_LAZY_NORMAL : TT_LAZY_UNIFORM, tt_rng, a, b, n};
  uint64_t draws = normal ? 2 * (uint64_t)((n + 1) / 2) : (uint64_t)n;
  if (!lazy_on || n == 0) {
    TT_TRY(tt_tensor_empty(shape, ndim, TT_F32, TT_CPU, out));
    lazy_fill(&z, 0, n, tt_tensor_data(*out));
  } else {
    TT_TRY(lazy_tensor(&z, shape, ndim, nbytes, TT_CPU, out));
  }
  tt_rng = z.state + draws * 0x9e3779b97f4a7c15ULL;
  return 0;
}

int tt_tensor_randn(const int64_t *shape, int ndim, double mean, double std, tt_tensor **out) {
  return random_tensor(shape, ndim, 1, mean, std, out);
}

int tt_tensor_lazy_zeros(const int64_t *shape, int ndim, int device, tt_tensor **out) {
  int64_t n;
  TT_TRY(tt_shape_numel_checked("lazy_zeros", shape, ndim, &n));
  if (n == 0 || !tt_backend_for(device)) return tt_tensor_zeros(shape, ndim, TT_F32, device, out);
  const tt_lazy_init z = {TT_LAZY_ZEROS, 0, 0.0, 0.0, n};
  return lazy_tensor(&z, shape, ndim, (size_t)n * sizeof(float), device, out);
}

int tt_tensor_rand(const int64_t *shape, int ndim, double lo, double hi, tt_tensor **out) {
  return random_tensor(shape, ndim, 0, lo, hi, out);
}

/* -- Lazy storage ------------------------------------------------------------------- */

static pthread_mutex_t lazy_lock = PTHREAD_MUTEX_INITIALIZER;

static tt_lazy_init *lazy_of(const tt_storage *s) {
  return __atomic_load_n(&s->lazy, __ATOMIC_ACQUIRE);
}

/* Whether s is still lazy, with a copy of its descriptor in *out: taken under the lock,
** since a materialize on another thread frees the descriptor (the copy stays right: the
** draws are a function of it alone). */
static int lazy_snapshot(const tt_storage *s, tt_lazy_init *out) {
  if (!lazy_of(s)) return 0;
  pthread_mutex_lock(&lazy_lock);
  const tt_lazy_init *z = lazy_of(s);
  if (z) *out = *z;
  pthread_mutex_unlock(&lazy_lock);
  return z != NULL;
}

int tt_lazy_materialize(tt_storage *s) {
  if (!lazy_of(s)) return 0;
  pthread_mutex_lock(&lazy_lock);
  int rc = 0;
  tt_lazy_init *z = s->lazy;
  if (z && !s->data) rc = tt_storage_take(s);
  if (z && rc == 0) {
    if (s->device == TT_CPU) {
      lazy_fill(z, 0, z->numel, s->data);
    } else if (z->kind == TT_LAZY_ZEROS) {
      const tt_device_backend *be = tt_backend_for(s->device);
      rc = be ? be->memset0(s->data, s->device, (size_t)z->numel * sizeof(float)) : -1;
    } else {   /* drawn on the host, then uploaded */
      float *host = malloc((size_t)z->numel * sizeof(float) + 1);
      const tt_device_backend *be = tt_backend_for(s->device);
      rc = host && be ? 0 : (host ? -1 : tt_set_error("out of host memory (%lld floats to "
                                                       "draw)", (long long)z->numel));
      if (rc == 0) {
        lazy_fill(z, 0, z->numel, host);
        rc = be->memcpy(s->data, s->device, host, TT_CPU, (size_t)z->numel * sizeof(float));
      }
      free(host);
    }
    if (rc == 0) {
      __atomic_store_n(&s->lazy, NULL, __ATOMIC_RELEASE);
      free(z);
    }
  }
  pthread_mutex_unlock(&lazy_lock);
  return rc;
}

int tt_tensor_materialize(tt_tensor *t) { return tt_lazy_materialize(t->storage); }
int tt_tensor_is_lazy(const tt_tensor *t) { return lazy_of(t->storage) != NULL; }

/* The elements of a view of a lazy storage, drawn alone into a new contiguous f32 CPU
** tensor: each innermost row is a run of storage indices when its stride is 1. */
static int lazy_view_values(const tt_tensor *v, const tt_lazy_init *z, tt_tensor **out) {
  TT_TRY(tt_tensor_empty(v->shape, v->ndim, TT_F32, TT_CPU, out));
  float *p = tt_tensor_data(*out);
  int64_t n = tt_tensor_numel(v);
  if (n == 0) return 0;
  int last = v->ndim - 1;
  int64_t len = v->ndim ? v->shape[last] : 1, step = v->ndim ? v->stride[last] : 1;
  /* Rows in parallel where there are enough of them (a row-parallel slice's rows are
  ** short); lazy_fill's own threads then stay off, OpenMP not nesting. Fewer rows than
  ** threads (a ZeRO-3 share is one row of a flat view) go one by one, each row drawn by
  ** lazy_fill's threads, where a team of one row drew it on one core. */
  const int64_t rows = n / len;
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN && rows >= tt_get_num_threads())
  for (int64_t row = 0; row < rows; row++) {
    int64_t base = v->offset, rest = row;
    for (int d = last - 1; d >= 0; d--) {
      base += (rest % v->shape[d]) * v->stride[d];
      rest /= v->shape[d];
    }
    if (step == 1) {
      lazy_fill(z, base, len, p + row * len);
    } else {
      for (int64_t j = 0; j < len; j++) lazy_fill(z, base + j * step, 1, p + row * len + j);
    }
  }
  return 0;
}

int tt_tensor_randint(const int64_t *shape, int ndim, int64_t lo, int64_t hi, int dtype,
                      tt_tensor **out) {
  TT_CHECK(hi > lo, "randint: empty range [%lld, %lld)", (long long)lo, (long long)hi);
  TT_CHECK(dtype == TT_I32 || dtype == TT_I64, "randint: dtype must be i32 or i64, got %s",
           tt_dtype_name(dtype));
  TT_TRY(tt_tensor_empty(shape, ndim, dtype, TT_CPU, out));
  int64_t n = tt_tensor_numel(*out);
  uint64_t range = (uint64_t)(hi - lo);
  for (int64_t i = 0; i < n; i++) {
    int64_t v = lo + (int64_t)(rng_next() % range);
    if (dtype == TT_I32) ((int32_t *)tt_tensor_data(*out))[i] = (int32_t)v;
    else ((int64_t *)tt_tensor_data(*out))[i] = v;
  }
  return 0;
}

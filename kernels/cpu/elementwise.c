/*
** elementwise.c — CPU kernels of the elementwise family (see kernels/elementwise.h).
**
** Every kernel walks the contiguous output in flat order. The flat range is cut into
** one slice per OpenMP thread; inside a slice the walk goes run by run along the
** innermost dim, where each input has stride 1 (dense), 0 (broadcast) or something
** else (a strided view). The dense/broadcast combinations get their own loops so the
** compiler vectorises them.
*/
#include "elementwise.h"
#include "kernel.h"
#include <math.h>
#include <omp.h>

/* -- Walking a broadcast ------------------------------------------------------------- */

/* One run along the innermost dim: output positions [pos, pos + n), inputs starting at
** element offsets oa / ob with strides sa / sb. */
typedef void (*run_fn)(void *ctx, int64_t pos, int64_t oa, int64_t sa, int64_t ob,
                       int64_t sb, int64_t n);

/* Calls `run` for every innermost run of the flat output range [start, end). */
static void walk_range(const tt_bcast *bc, int64_t start, int64_t end, run_fn run,
                       void *ctx) {
  const int nd = bc->ndim;
  const int64_t inner = bc->shape[nd - 1];
  int64_t idx[8];
  int64_t rem = start, oa = 0, ob = 0;
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = rem % bc->shape[d];
    rem /= bc->shape[d];
    oa += idx[d] * bc->stride_a[d];
    ob += idx[d] * bc->stride_b[d];
  }
  const int64_t sa = bc->stride_a[nd - 1], sb = bc->stride_b[nd - 1];
  int64_t pos = start;
  while (pos < end) {
    int64_t n = inner - idx[nd - 1];
    if (n > end - pos) n = end - pos;
    run(ctx, pos, oa, sa, ob, sb, n);
    pos += n;
    idx[nd - 1] += n;
    oa += n * sa;
    ob += n * sb;
    /* Carry into the outer dims once a run reaches the end of its row. */
    for (int d = nd - 1; d > 0 && idx[d] == bc->shape[d]; d--) {
      oa += bc->stride_a[d - 1] - bc->shape[d] * bc->stride_a[d];
      ob += bc->stride_b[d - 1] - bc->shape[d] * bc->stride_b[d];
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

static int64_t bcast_numel(const tt_bcast *bc) {
  int64_t n = 1;
  for (int d = 0; d < bc->ndim; d++) n *= bc->shape[d];
  return n;
}

/* Splits [0, numel) into one slice per thread (slices start on 16-float boundaries so
** threads never write the same cache line) and walks each. */
static void walk(const tt_bcast *bc, run_fn run, void *ctx) {
  const int64_t n = bcast_numel(bc);
  if (n == 0) return;
#pragma omp parallel if (n > TT_PARALLEL_GRAIN)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t chunk = (n + nt - 1) / nt;
    chunk = (chunk + 15) & ~(int64_t)15;
    const int64_t start = t * chunk;
    const int64_t end = start + chunk < n ? start + chunk : n;
    if (start < end) walk_range(bc, start, end, run, ctx);
  }
}

/* -- Binary forward ------------------------------------------------------------------ */

typedef struct binary_ctx {
  float *out;
  const float *a, *b;
} binary_ctx;

/* One run of `o = EXPR(x, y)` with the four stride cases. */
#define TT_BINARY_RUN(name, EXPR)                                                          \
  static void name(void *vctx, int64_t pos, int64_t oa, int64_t sa, int64_t ob,           \
                   int64_t sb, int64_t n) {                                               \
    const binary_ctx *c = vctx;                                                           \
    float *restrict o = c->out + pos;                                                     \
    const float *restrict pa = c->a + oa;                                                 \
    const float *restrict pb = c->b + ob;                                                 \
    if (sa == 1 && sb == 1) {                                                             \
      for (int64_t i = 0; i < n; i++) { float x = pa[i], y = pb[i]; o[i] = (EXPR); }      \
    } else if (sa == 1 && sb == 0) {                                                      \
      const float y = pb[0];                                                              \
      for (int64_t i = 0; i < n; i++) { float x = pa[i]; o[i] = (EXPR); }                 \
    } else if (sa == 0 && sb == 1) {                                                      \
      const float x = pa[0];                                                              \
      for (int64_t i = 0; i < n; i++) { float y = pb[i]; o[i] = (EXPR); }                 \
    } else {                                                                              \
      for (int64_t i = 0; i < n; i++) {                                                   \
        float x = pa[i * sa], y = pb[i * sb];                                             \
        o[i] = (EXPR);                                                                    \
      }                                                                                   \
    }                                                                                     \
  }

TT_BINARY_RUN(run_add, x + y)
TT_BINARY_RUN(run_sub, x - y)
TT_BINARY_RUN(run_mul, x * y)
TT_BINARY_RUN(run_div, x / y)

static int cpu_binary(int op, float *out, const float *a, const float *b,
                      const tt_bcast *bc) {
  static const run_fn runs[4] = {run_add, run_sub, run_mul, run_div};
  if (op < 0 || op > 3) return tt_set_error("elementwise: unknown binary op %d", op);
  binary_ctx c = {out, a, b};
  walk(bc, runs[op], &c);
  return 0;
}

/* -- Binary backward ----------------------------------------------------------------- */

typedef struct binary_grad_ctx {
  float *ga, *gb;
  const float *g, *a, *b;
} binary_grad_ctx;

/* mul: ga = g * b, gb = g * a. */
static void run_mul_grad(void *vctx, int64_t pos, int64_t oa, int64_t sa, int64_t ob,
                         int64_t sb, int64_t n) {
  const binary_grad_ctx *c = vctx;
  const float *restrict g = c->g + pos;
  if (c->ga) {
    float *restrict ga = c->ga + pos;
    const float *restrict pb = c->b + ob;
    if (sb == 1)
      for (int64_t i = 0; i < n; i++) ga[i] = g[i] * pb[i];
    else
      for (int64_t i = 0; i < n; i++) ga[i] = g[i] * pb[i * sb];
  }
  if (c->gb) {
    float *restrict gb = c->gb + pos;
    const float *restrict pa = c->a + oa;
    if (sa == 1)
      for (int64_t i = 0; i < n; i++) gb[i] = g[i] * pa[i];
    else
      for (int64_t i = 0; i < n; i++) gb[i] = g[i] * pa[i * sa];
  }
}

/* div: ga = g / b, gb = -g * a / b^2 = -(g / b) * (a / b). */
static void run_div_grad(void *vctx, int64_t pos, int64_t oa, int64_t sa, int64_t ob,
                         int64_t sb, int64_t n) {
  const binary_grad_ctx *c = vctx;
  const float *restrict g = c->g + pos;
  const float *restrict pa = c->a + oa;
  const float *restrict pb = c->b + ob;
  float *restrict ga = c->ga ? c->ga + pos : NULL;
  float *restrict gb = c->gb ? c->gb + pos : NULL;
  for (int64_t i = 0; i < n; i++) {
    const float y = pb[i * sb];
    const float q = g[i] / y;
    if (ga) ga[i] = q;
    if (gb) gb[i] = -q * (pa[i * sa] / y);
  }
}

static int cpu_binary_backward(int op, float *ga, float *gb, const float *g, const float *a,
                               const float *b, const tt_bcast *bc) {
  binary_grad_ctx c = {ga, gb, g, a, b};
  switch (op) {
    case TT_BINARY_MUL: walk(bc, run_mul_grad, &c); return 0;
    case TT_BINARY_DIV: walk(bc, run_div_grad, &c); return 0;
    default: return tt_set_error("elementwise: binary op %d has no backward kernel", op);
  }
}

/* -- Affine and axpy ----------------------------------------------------------------- */

static int cpu_affine(float *out, const float *a, int64_t n, float mul, float add) {
#pragma omp parallel for simd if (n > TT_PARALLEL_GRAIN) schedule(static)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] * mul + add;
  return 0;
}

typedef struct axpy_ctx {
  float *a;
  const float *b;
  float alpha;
} axpy_ctx;

static void run_axpy(void *vctx, int64_t pos, int64_t oa, int64_t sa, int64_t ob,
                     int64_t sb, int64_t n) {
  (void)oa;
  (void)sa;
  const axpy_ctx *c = vctx;
  float *restrict a = c->a + pos;
  const float *restrict b = c->b + ob;
  const float alpha = c->alpha;
  /* fmaf, not a[i] += alpha * b[i]: whether the compiler contracts that depends on the
  ** optimization level (GCC forms FMAs from -O2), and the half one pass (below) must equal
  ** the widened passes bit for bit at any level (it differed at -O1). */
  if (sb == 1)
    for (int64_t i = 0; i < n; i++) a[i] = fmaf(alpha, b[i], a[i]);
  else
    for (int64_t i = 0; i < n; i++) a[i] = fmaf(alpha, b[i * sb], a[i]);
}

static int cpu_axpy(float *a, float alpha, const float *b, const tt_bcast *bc) {
  axpy_ctx c = {a, b, alpha};
  walk(bc, run_axpy, &c);
  return 0;
}

static int cpu_axpy_half(void *a, int a_dtype, float alpha, const void *b, int b_dtype,
                         int64_t n) {
  uint16_t *pa = a;
  const int bf = a_dtype == TT_ELEM_BF16, b32 = b_dtype == TT_ELEM_F32;
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    const float x = bf ? tt_elem_bf16_to_float(pa[i]) : tt_elem_f16_to_float(pa[i]);
    const uint16_t hb = b32 ? 0 : ((const uint16_t *)b)[i];
    const float y = b32 ? ((const float *)b)[i]
                        : bf ? tt_elem_bf16_to_float(hb) : tt_elem_f16_to_float(hb);
    const float r = fmaf(alpha, y, x);
    pa[i] = bf ? tt_elem_float_to_bf16(r) : tt_elem_float_to_f16(r);
  }
  return 0;
}

const tt_elementwise_kernels tt_elementwise_cpu = {
  .binary = cpu_binary,
  .binary_backward = cpu_binary_backward,
  .affine = cpu_affine,
  .axpy = cpu_axpy,
  .axpy_half = cpu_axpy_half,
};

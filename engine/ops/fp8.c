/*
** fp8.c — FP8 scaling: per-tensor scales with delayed scaling, quantise / dequantise,
** and an FP8 linear op (e4m3 activations and weights, e5m2 output gradients).
**
** An fp8 number has 3 (e4m3) or 2 (e5m2) mantissa bits and a narrow range, so every
** tensor is multiplied by a scale before the cast, chosen to put its largest magnitude
** near the fp8 maximum. Delayed scaling takes that scale from the amax of the last few
** quantisations of the same tensor (a ring of history_len values) instead of a pass over
** the current one: amax moves slowly during training, and one pass is saved. On CPU the
** values are quantised and dequantised in C and the GEMMs run in f32 on the dequantised
** values, which reproduces FP8 rounding exactly (the emulation tests run here).
*/
#include "core/tt_internal.h"
#include "tetra_amp.h"
#include "tt_cuda_ops.h"
#include <math.h>

extern int tt_cuda_fp8_quantize(const void *x, int x_dtype, int64_t n, float scale,
                                int fp8_dtype, int fake, void *out, float *amax)
    __attribute__((weak));
extern int tt_cuda_fp8_dequantize(const void *q, int fp8_dtype, int64_t n, float scale,
                                  float *out) __attribute__((weak));

/* -- Scaling metadata --------------------------------------------------------------- */

double tt_fp8_max(int dtype) {
  return dtype == TT_E4M3 ? 448.0 : dtype == TT_E5M2 ? 57344.0 : 0.0;
}

int tt_fp8_meta_init(tt_fp8_meta *m, int dtype, int history_len, int margin) {
  TT_CHECK(m != NULL, "tt_fp8_meta_init: meta is NULL");
  TT_CHECK(dtype == TT_E4M3 || dtype == TT_E5M2,
           "fp8 meta: dtype must be e4m3 or e5m2, got %s", tt_dtype_name(dtype));
  if (history_len == 0) history_len = 16;
  TT_CHECK(history_len > 0 && history_len <= TT_FP8_MAX_HISTORY,
           "fp8 meta: history_len must be in 1..%d, got %d", TT_FP8_MAX_HISTORY,
           history_len);
  TT_CHECK(margin >= 0 && margin < 64, "fp8 meta: margin must be in 0..63, got %d", margin);
  memset(m, 0, sizeof(*m));
  m->dtype = dtype;
  m->history_len = history_len;
  m->margin = margin;
  m->scale = 1.0;
  return 0;
}

/* The scale is computed in float, in this order, because the device computes it so
** (engine/cuda/fp8_linear.cu, without a host sync): both sides then hold the same
** float scale and quantise to the same codes. */
float tt_fp8_scale_from_amax(int dtype, float amax, int margin) {
  return ((float)tt_fp8_max(dtype) / amax) * ldexpf(1.0f, -margin);
}

void tt_fp8_meta_update(tt_fp8_meta *m, double amax) {
  /* A zero or non-finite amax says nothing about the range (an all-zero gradient, an
  ** overflowed step the loss scaler will skip): keep the scale. */
  if (!(amax > 0) || !isfinite(amax) || !((float)amax > 0)) return;
  m->amax_history[m->pos] = (float)amax;
  m->pos = (m->pos + 1) % m->history_len;
  if (m->filled < m->history_len) m->filled++;
  float hmax = 0;
  for (int i = 0; i < m->filled; i++) hmax = fmaxf(hmax, m->amax_history[i]);
  /* A tiny amax gives a scale past float's range: keep the last finite one. */
  float s = tt_fp8_scale_from_amax(m->dtype, hmax, m->margin);
  if (isfinite(s) && s > 0) m->scale = s;
}

/* -- Quantise / dequantise (CPU) ---------------------------------------------------- */

static float load_float(const void *p, int dtype, int64_t i) {
  switch (dtype) {
    case TT_BF16: return tt_bf16_to_float(((const uint16_t *)p)[i]);
    case TT_F16: return tt_f16_to_float(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
  }
}

/* fp8 -> float for all 256 codes of one dtype: dequantising is a table lookup. */
static void fp8_table(int dtype, float table[256]) {
  for (int c = 0; c < 256; c++) table[c] = tt_fp8_to_float((uint8_t)c, dtype);
}

/* fake = 0: out (uint8) = fp8(x * scale); fake = 1: out (float) = float(that) / scale.
** Returns max |x|, NaN when x holds a NaN. */
static double quantize_cpu(const void *x, int x_dtype, int64_t n, float scale, int dtype,
                           int fake, void *out) {
  float table[256];
  fp8_table(dtype, table);
  float inv = 1.0f / scale;
  float amax = 0;
  int nan = 0;
  #pragma omp parallel for reduction(max:amax) reduction(|:nan) if(n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    float v = load_float(x, x_dtype, i);
    nan |= isnan(v);
    amax = fmaxf(amax, fabsf(v));
    uint8_t q = tt_float_to_fp8(v * scale, dtype);
    if (fake) ((float *)out)[i] = table[q] * inv;
    else ((uint8_t *)out)[i] = q;
  }
  return nan ? NAN : (double)amax;
}

/* Contiguous f32/bf16/f16 copy of x (x itself, retained, when already contiguous). */
static int float_input(const char *op, tt_tensor *x, tt_tensor **out) {
  TT_CHECK(x != NULL, "%s: input is NULL", op);
  TT_CHECK(x->dtype == TT_F32 || x->dtype == TT_BF16 || x->dtype == TT_F16,
           "%s: input has dtype %s (want f32, bf16 or f16)", op, tt_dtype_name(x->dtype));
  return tt_contiguous_nograd(x, out);
}

static int quantize_into(const char *op, tt_tensor *x, int dtype, double scale, int fake,
                         tt_tensor **out, double *amax) {
  TT_CHECK(dtype == TT_E4M3 || dtype == TT_E5M2, "%s: dtype must be e4m3 or e5m2, got %s",
           op, tt_dtype_name(dtype));
  TT_CHECK(scale > 0 && isfinite(scale), "%s: scale must be positive and finite, got %g",
           op, scale);
  tt_tensor *xc = NULL, *q = NULL;
  TT_TRY(float_input(op, x, &xc));
  if (tt_tensor_empty(xc->shape, xc->ndim, fake ? TT_F32 : dtype, xc->device, &q)) goto fail;
  int64_t n = tt_tensor_numel(xc);
  double a;
  if (tt_device_is_cuda(xc->device)) {
    if (!tt_cuda_fp8_quantize) { tt_no_kernel(op, xc->device); goto fail; }
    float af = 0;
    if (tt_cuda_fp8_quantize(tt_tensor_data(xc), xc->dtype, n, (float)scale, dtype, fake,
                             tt_tensor_data(q), &af))
      goto fail;
    a = af;
  } else {
    a = quantize_cpu(tt_tensor_data(xc), xc->dtype, n, (float)scale, dtype, fake,
                     tt_tensor_data(q));
  }
  tt_tensor_release(xc);
  if (amax) *amax = a;
  *out = q;
  return 0;
fail:
  tt_tensor_release(xc);
  tt_tensor_release(q);
  return -1;
}

int tt_fp8_quantize(tt_tensor *x, int dtype, double scale, tt_tensor **out, double *amax) {
  return quantize_into("fp8_quantize", x, dtype, scale, 0, out, amax);
}

int tt_fp8_fake_quantize(tt_tensor *x, int dtype, double scale, tt_tensor **out,
                         double *amax) {
  return quantize_into("fp8_fake_quantize", x, dtype, scale, 1, out, amax);
}

int tt_fp8_dequantize(tt_tensor *q, double scale, tt_tensor **out) {
  TT_CHECK(q != NULL && (q->dtype == TT_E4M3 || q->dtype == TT_E5M2),
           "fp8_dequantize: input must be e4m3 or e5m2");
  TT_CHECK(scale > 0 && isfinite(scale), "fp8_dequantize: scale must be positive, got %g",
           scale);
  tt_tensor *qc = NULL, *x = NULL;
  TT_TRY(tt_contiguous_nograd(q, &qc));
  if (tt_tensor_empty(qc->shape, qc->ndim, TT_F32, qc->device, &x)) goto fail;
  int64_t n = tt_tensor_numel(qc);
  if (tt_device_is_cuda(qc->device)) {
    if (!tt_cuda_fp8_dequantize) { tt_no_kernel("fp8_dequantize", qc->device); goto fail; }
    if (tt_cuda_fp8_dequantize(tt_tensor_data(qc), qc->dtype, n, (float)scale,
                               tt_tensor_data(x)))
      goto fail;
  } else {
    float table[256];
    fp8_table(qc->dtype, table);
    float inv = (float)(1.0 / scale);
    const uint8_t *src = tt_tensor_data(qc);
    float *dst = tt_tensor_data(x);
    #pragma omp parallel for if(n > TT_PARALLEL_GRAIN)
    for (int64_t i = 0; i < n; i++) dst[i] = table[src[i]] * inv;
  }
  tt_tensor_release(qc);
  *out = x;
  return 0;
fail:
  tt_tensor_release(qc);
  tt_tensor_release(x);
  return -1;
}

/* -- FP8 linear --------------------------------------------------------------------- */
/*
** What the GPU computes (engine/cuda/fp8_linear.cu, cuBLASLt FP8 GEMMs), and so what the
** CPU emulates here, with s_t the float scale of tensor t and q_t = fp8(t * s_t):
**   forward   Y  (rows, out) = bf16( acc(q_x q_w^T) * (1/s_x * 1/s_w) + bf16(bias) )
**   backward  dX (rows, in)  = bf16( acc(q_g q_w)   * (1/s_g * 1/s_w) )
**             dW (out, in)   =       acc(q_g^T q_x) * (1/s_g * 1/s_x)        (f32)
**             db (out)       = column sums of the unquantised gradient       (f32)
** x and w are e4m3, the output gradient g e5m2. acc is a float32 sum of products of fp8
** values: every product of two fp8 numbers is exact in float32, and the CPU adds them in
** float32. Hopper's FP8 tensor cores keep fewer bits in their running sum (about 14:
** DeepSeek-V3's report, 3.3.2), so the GPU's sums are off the CPU's in their low bits,
** and after the epilogue's rounding to bf16 some elements by an ulp or so
** (tests/cuda/test_fp8_linear.c holds them to that). The epilogue
** multiplies by the product of the two float inverse scales and adds the bias rounded
** to bf16 (cuBLASLt reads the bias in the output's dtype), then rounds to bf16 once.
** Y and dX come back in x's dtype holding bf16 values; dW in the weight's dtype.
**
** Scales are delayed: each tensor is quantised with the scale its meta holds (from the
** amax history), and its amax then joins the history. The first quantisation of a meta,
** with an empty history, scales from the tensor's own amax. With an amax group (data,
** context, tensor parallelism) the amaxes are agreed first, an all-reduce MAX, so that
** every rank of the group holds the scales one process on the whole batch would: a
** weight or a batch split over the group has that amax only as the max of the parts.
*/

#include "tetra_dist.h"

extern int tt_cuda_fp8_linear(tt_tensor *x, tt_tensor *w, tt_tensor *bias,
                              tt_fp8_linear_state *st, tt_tensor **out) __attribute__((weak));
extern void tt_cuda_fp8_linear_state_free(void *device) __attribute__((weak));

int tt_fp8_linear_state_init(tt_fp8_linear_state *st, int history_len, int margin) {
  TT_CHECK(st != NULL, "tt_fp8_linear_state_init: state is NULL");
  memset(st, 0, sizeof(*st));
  TT_TRY(tt_fp8_meta_init(&st->x, TT_E4M3, history_len, margin));
  TT_TRY(tt_fp8_meta_init(&st->w, TT_E4M3, history_len, margin));
  TT_TRY(tt_fp8_meta_init(&st->g, TT_E5M2, history_len, margin));
  return 0;
}

void tt_fp8_linear_state_release(tt_fp8_linear_state *st) {
  if (!st || !st->device) return;
  if (tt_cuda_fp8_linear_state_free) tt_cuda_fp8_linear_state_free(st->device);
  st->device = NULL;
}

/* amax[0..n) = the max of each over the amax group (in place); NaN travels as
** +inf, which tt_fp8_meta_update ignores like NaN. */
static int agree_amax(void *group, double *amax, int n) {
  for (int i = 0; i < n; i++)
    if (isnan(amax[i])) amax[i] = INFINITY;
  if (!group || tt_comm_size((tt_comm *)group) == 1) return 0;
  int64_t len = n;
  tt_tensor *t = NULL;
  TT_TRY(tt_tensor_from_f64(amax, &len, 1, TT_F32, &t));
  int rc = tt_comm_all_reduce((tt_comm *)group, t, TT_REDUCE_MAX);
  if (!rc) rc = tt_tensor_to_f64(t, amax);
  tt_tensor_release(t);
  return rc ? tt_error_context("fp8: agreeing amax over the amax group") : 0;
}

/* max |x| of a contiguous float tensor on the CPU; NaN when x holds one. */
static double amax_cpu(tt_tensor *x) {
  int64_t n = tt_tensor_numel(x);
  const void *p = tt_tensor_data(x);
  float amax = 0;
  int nan = 0;
  #pragma omp parallel for reduction(max:amax) reduction(|:nan) if(n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    float v = load_float(p, x->dtype, i);
    nan |= isnan(v);
    amax = fmaxf(amax, fabsf(v));
  }
  return nan ? NAN : (double)amax;
}

/* codes[i] = fp8(x_i * s_i) at each meta's delayed scale for n tensors (x_i contiguous,
** on the CPU), each meta's history then updated with the agreed amaxes; *scale_used gets
** the float scales the codes were made with. Without `record` (inference,
** tt_fp8_inference) at the metas' scales, with nothing recorded: a history still empty
** lends the scale its tensor's own amax gives (not agreed: inference never communicates,
** since a sample may be drawn on one rank of the group only), and stays empty. */
static int quantize_delayed(const char *op, tt_tensor **x, tt_fp8_meta **m, int n,
                            void *group, int record, tt_tensor **codes, float *scale_used) {
  double amax[3];
  int fresh[3], any_fresh = 0;
  for (int i = 0; i < n; i++) {
    any_fresh |= fresh[i] = m[i]->quantised == 0;
    scale_used[i] = (float)m[i]->scale;
  }
  if (any_fresh) {
    /* An empty history has no scale yet: take it from this tensor's own (agreed) amax,
    ** which becomes the history's first entry. The metas are the same on every rank of
    ** the group, so every rank takes this branch together. */
    for (int i = 0; i < n; i++) amax[i] = fresh[i] ? amax_cpu(x[i]) : 0;
    if (record) TT_TRY(agree_amax(group, amax, n));
    for (int i = 0; i < n; i++) {
      if (!fresh[i]) continue;
      if (record) {
        tt_fp8_meta_update(m[i], amax[i]);
        scale_used[i] = (float)m[i]->scale;
      } else {
        const float s = tt_fp8_scale_from_amax(m[i]->dtype, (float)amax[i], m[i]->margin);
        if (amax[i] > 0 && isfinite(amax[i]) && isfinite(s) && s > 0) scale_used[i] = s;
      }
    }
  }
  for (int i = 0; i < n; i++) {
    TT_TRY(quantize_into(op, x[i], m[i]->dtype, scale_used[i], 0, &codes[i],
                         record ? &amax[i] : NULL));
    if (fresh[i]) amax[i] = 0;   /* already recorded above */
  }
  if (!record) return 0;
  TT_TRY(agree_amax(group, amax, n));
  for (int i = 0; i < n; i++) {
    tt_fp8_meta_update(m[i], amax[i]);
    m[i]->quantised++;
  }
  return 0;
}

/* The forward's quantisation of x and w (quantize_delayed). Inside activation recompute
** (tt_checkpoint) a checkpointed block's first run stashes the two scales it used, and
** its re-run in backward quantises with those, recording no amax: the histories move
** once per forward, and the re-run's codes are the first run's. An inference forward
** records nothing either. */
static int fp8_forward_quantize(tt_tensor **x, tt_fp8_meta **m, void *group, int inference,
                                tt_tensor **codes, float *scale_used) {
  if (tt_checkpoint_mode() == TT_CKPT_REPLAYING) {
    double s[2];
    TT_TRY(tt_checkpoint_replay(s, 2));
    for (int i = 0; i < 2; i++) {
      scale_used[i] = (float)s[i];
      TT_TRY(quantize_into("fp8_linear", x[i], m[i]->dtype, scale_used[i], 0, &codes[i], NULL));
    }
    return 0;
  }
  TT_TRY(quantize_delayed("fp8_linear", x, m, 2, group, !inference, codes, scale_used));
  double s[2] = {scale_used[0], scale_used[1]};
  return tt_checkpoint_stash(s, 2);
}

/* A new f32 tensor of the fp8 values of `codes` (not divided by any scale): exact, and
** what the tensor cores multiply. */
static int decode_fp8(tt_tensor *codes, tt_tensor **out) {
  TT_TRY(tt_tensor_empty(codes->shape, codes->ndim, TT_F32, TT_CPU, out));
  float table[256];
  fp8_table(codes->dtype, table);
  int64_t n = tt_tensor_numel(codes);
  const uint8_t *src = tt_tensor_data(codes);
  float *dst = tt_tensor_data(*out);
  #pragma omp parallel for if(n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) dst[i] = table[src[i]];
  return 0;
}

static float round_bf16(float v) { return tt_bf16_to_float(tt_float_to_bf16(v)); }

/* out (dtype) = epilogue of acc (f32, (rows, cols)): acc * descale (+ bias[col] rounded
** to bf16), rounded to bf16 when to_bf16. */
static int epilogue(tt_tensor *acc, float descale, const float *bias, int to_bf16,
                    int dtype, tt_tensor **out) {
  int64_t cols = acc->shape[acc->ndim - 1], n = tt_tensor_numel(acc);
  tt_tensor *y = NULL;
  TT_TRY(tt_tensor_empty(acc->shape, acc->ndim, TT_F32, TT_CPU, &y));
  const float *a = tt_tensor_data(acc);
  float *d = tt_tensor_data(y);
  #pragma omp parallel for if(n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    float v = a[i] * descale;
    if (bias) v += round_bf16(bias[i % cols]);
    d[i] = to_bf16 ? round_bf16(v) : v;
  }
  if (dtype == TT_F32) {
    *out = y;
    return 0;
  }
  int rc = tt_cast(y, dtype, out);
  tt_tensor_release(y);
  return rc;
}

/* inputs: x, w, bias; saved[0] = q_x (rows, in), saved[1] = q_w (out, in): the fp8
** codes (what the GPU keeps for backward); f[0], f[1] the scales they were made with. */
static int fp8_linear_backward(tt_node *node, tt_tensor *grad_out) {
  tt_fp8_linear_state *st = node->ctx;
  tt_tensor *x = node->inputs[0], *w = node->inputs[1], *bias = node->inputs[2];
  tt_tensor *qx = node->saved[0], *qw = node->saved[1];
  const float sx = (float)node->f[0], sw = (float)node->f[1];
  tt_tensor *g = NULL, *g2 = NULL, *qg = NULL, *dg = NULL, *dxw = NULL, *dww = NULL;
  tt_tensor *acc = NULL, *dx = NULL, *dw = NULL, *db = NULL, *dx2 = NULL;
  int grad = tt_is_grad_enabled();
  int rc = -1;
  float sg;
  tt_set_grad_enabled(0);
  int64_t g_shape[2] = {-1, w->shape[0]};
  if (tt_contiguous_nograd(grad_out, &g) || tt_view(g, g_shape, 2, &g2)) goto done;
  {
    tt_fp8_meta *m = &st->g;
    if (quantize_delayed("fp8_linear backward", &g2, &m, 1, st->amax_group, 1, &qg, &sg))
      goto done;
  }
  if (decode_fp8(qg, &dg)) goto done;
  if (tt_needs_grad(x)) {
    /* dX (rows, in) = q_g (rows, out) @ q_w (out, in) */
    if (decode_fp8(qw, &dww) || tt_matmul(dg, dww, NULL, 0, 0, &acc) ||
        epilogue(acc, (1.0f / sg) * (1.0f / sw), NULL, 1, x->dtype, &dx) ||
        tt_view(dx, x->shape, x->ndim, &dx2) || tt_accumulate_grad(x, dx2))
      goto done;
    tt_tensor_release(acc);
    acc = NULL;
  }
  if (tt_needs_grad(w)) {
    /* dW (out, in) = q_g^T (out, rows) @ q_x (rows, in) */
    if (decode_fp8(qx, &dxw) || tt_matmul(dg, dxw, NULL, 1, 0, &acc) ||
        epilogue(acc, (1.0f / sg) * (1.0f / sx), NULL, 0, w->dtype, &dw) ||
        tt_accumulate_grad(w, dw))
      goto done;
  }
  if (bias && tt_needs_grad(bias)) {
    /* The bias gradient needs no GEMM, so it takes the unquantised gradient, summed in
    ** f32 (a bf16 gradient, with bf16 activations, is widened first). */
    int dims[1] = {0};
    tt_tensor *g32 = g2;
    if (g2->dtype != TT_F32 && tt_cast(g2, TT_F32, &g32)) goto done;
    const int bad = tt_sum(g32, dims, 1, 0, &db);
    if (g32 != g2) tt_tensor_release(g32);
    if (bad || tt_accumulate_grad(bias, db)) goto done;
  }
  rc = 0;
done:
  tt_set_grad_enabled(grad);
  tt_tensor *all[] = {g, g2, qg, dg, dxw, dww, acc, dx, dw, db, dx2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  return rc ? tt_error_context("fp8_linear backward") : 0;
}

int tt_fp8_linear(tt_tensor *x, tt_tensor *w, tt_tensor *bias, tt_fp8_linear_state *st,
                  tt_tensor **out) {
  TT_CHECK(x && w && st && out, "fp8_linear: x, w, state and out must not be NULL");
  TT_CHECK(w->ndim == 2, "fp8_linear: weight must be (out, in), got %d dims", w->ndim);
  TT_CHECK(x->ndim >= 1 && x->shape[x->ndim - 1] == w->shape[1],
           "fp8_linear: x's last dim (%lld) must equal the weight's in features (%lld)",
           (long long)(x->ndim ? x->shape[x->ndim - 1] : 0), (long long)w->shape[1]);
  TT_CHECK(!bias || (bias->ndim == 1 && bias->shape[0] == w->shape[0]),
           "fp8_linear: bias must be [%lld]", (long long)w->shape[0]);
  tt_tensor *ins[3] = {x, w, bias};
  TT_TRY(tt_check_same_device("fp8_linear", ins, bias ? 3 : 2));
  if (tt_device_is_cuda(x->device)) {
    if (!tt_cuda_fp8_linear) return tt_no_kernel("fp8_linear", x->device);
    return tt_cuda_fp8_linear(x, w, bias, st, out);
  }
  TT_CHECK(!st->fast_accum,
           "fp8_linear: fast accumulation is a cuBLASLt option of the CUDA GEMM; the CPU "
           "emulation sums in fp32 (unset fast_accum, or run on cuda)");
  tt_tensor *xc = NULL, *x2 = NULL, *wc = NULL, *bc = NULL, *q[2] = {NULL, NULL};
  tt_tensor *dxq = NULL, *dwq = NULL, *acc = NULL, *y2 = NULL, *y = NULL;
  int64_t x_shape[2] = {-1, w->shape[1]};
  int64_t y_shape[TT_MAX_DIMS];
  for (int d = 0; d < x->ndim - 1; d++) y_shape[d] = x->shape[d];
  y_shape[x->ndim - 1] = w->shape[0];
  float scale[2];
  const int inference = tt_fp8_inference();
  int grad = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int rc = float_input("fp8_linear", x, &xc);
  if (!rc) rc = tt_view(xc, x_shape, 2, &x2);
  if (!rc) rc = float_input("fp8_linear", w, &wc);
  if (!rc && bias) rc = tt_cast(bias, TT_F32, &bc);
  if (!rc) {
    tt_tensor *ops[2] = {x2, wc};
    tt_fp8_meta *ms[2] = {&st->x, &st->w};
    rc = fp8_forward_quantize(ops, ms, st->amax_group, inference, q, scale);
  }
  /* Y (rows, out) = q_x (rows, in) @ q_w (out, in)^T. Under selective recompute the first
  ** run keeps a copy of Y as it leaves the layer (bf16 values in x's dtype, as the GPU's
  ** layer does), not the f32 product of the tt_matmul inside, and the re-run takes it
  ** back; the re-run still makes the codes (backward saves them). */
  if (!rc) {
    const int64_t y2_shape[2] = {x2->shape[0], w->shape[0]};
    rc = tt_checkpoint_take_output(y2_shape, 2, x->dtype, x->device, &y2);
  }
  if (!rc && !y2) {
    const int keep = tt_checkpoint_keep_swap(0);
    rc = decode_fp8(q[0], &dxq);
    if (!rc) rc = decode_fp8(q[1], &dwq);
    if (!rc) rc = tt_matmul(dxq, dwq, NULL, 0, 1, &acc);
    tt_checkpoint_keep_swap(keep);
    if (!rc) rc = epilogue(acc, (1.0f / scale[0]) * (1.0f / scale[1]),
                           bc ? tt_tensor_data(bc) : NULL, 1, x->dtype, &y2);
    if (!rc) rc = tt_checkpoint_keep_copy(y2);
  }
  if (!rc) rc = tt_view(y2, y_shape, x->ndim, &y);
  tt_set_grad_enabled(grad);
  if (!rc && tt_should_record(ins, 3)) {
    tt_node *node = tt_record("fp8_linear", fp8_linear_backward, y, ins, 3);
    if (!node) {
      rc = -1;
    } else {
      node->ctx = st;
      node->whole = 1;   /* backward records the gradient's amax: one run only */
      tt_node_save(node, q[0]);
      tt_node_save(node, q[1]);
      node->f[0] = scale[0];
      node->f[1] = scale[1];
    }
  }
  tt_tensor *tmp[] = {xc, x2, wc, bc, q[0], q[1], dxq, dwq, acc, y2};
  for (size_t i = 0; i < sizeof tmp / sizeof tmp[0]; i++) tt_tensor_release(tmp[i]);
  if (rc) {
    tt_tensor_release(y);
    return -1;
  }
  *out = y;
  return 0;
}

extern int tt_cuda_fp8_linear_state_sync(void *device, tt_fp8_linear_state *st,
                                         int to_device) __attribute__((weak));

int tt_fp8_linear_state_sync(tt_fp8_linear_state *st, int to_device) {
  TT_CHECK(st != NULL, "tt_fp8_linear_state_sync: state is NULL");
  if (!st->device) return 0;
  TT_CHECK(tt_cuda_fp8_linear_state_sync != NULL,
           "tt_fp8_linear_state_sync: a device state in a build without CUDA");
  return tt_cuda_fp8_linear_state_sync(st->device, st, to_device);
}

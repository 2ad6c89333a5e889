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
#include "tt_internal.h"
#include "tetra_amp.h"
#include "cuda/tt_cuda_ops.h"
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

void tt_fp8_meta_update(tt_fp8_meta *m, double amax) {
  /* A zero or non-finite amax says nothing about the range (an all-zero gradient, an
  ** overflowed step the loss scaler will skip): keep the scale. */
  if (!(amax > 0) || !isfinite(amax)) return;
  m->amax_history[m->pos] = (float)amax;
  m->pos = (m->pos + 1) % m->history_len;
  if (m->filled < m->history_len) m->filled++;
  double hmax = 0;
  for (int i = 0; i < m->filled; i++) hmax = fmax(hmax, m->amax_history[i]);
  m->scale = tt_fp8_max(m->dtype) / hmax * ldexp(1.0, -m->margin);
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

int tt_fp8_linear_state_init(tt_fp8_linear_state *st, int history_len, int margin) {
  TT_CHECK(st != NULL, "tt_fp8_linear_state_init: state is NULL");
  TT_TRY(tt_fp8_meta_init(&st->x, TT_E4M3, history_len, margin));
  TT_TRY(tt_fp8_meta_init(&st->w, TT_E4M3, history_len, margin));
  TT_TRY(tt_fp8_meta_init(&st->g, TT_E5M2, history_len, margin));
  return 0;
}

/* Round trip of x through fp8 at m's delayed scale; records x's amax into m. A meta
** with an empty history has no scale yet, so the first call scales from x's own amax. */
static int fake_quant_delayed(const char *op, tt_tensor *x, tt_fp8_meta *m,
                              tt_tensor **out) {
  double amax = 0;
  TT_TRY(quantize_into(op, x, m->dtype, m->scale, 1, out, &amax));
  if (m->filled == 0 && amax > 0 && isfinite(amax)) {
    tt_tensor_release(*out);
    *out = NULL;
    tt_fp8_meta_update(m, amax);
    return quantize_into(op, x, m->dtype, m->scale, 1, out, NULL);
  }
  tt_fp8_meta_update(m, amax);
  return 0;
}

/* saved[0] = xq (..., in), saved[1] = wq (out, in): the dequantised fp8 operands, so the
** backward GEMMs see the same values as the forward one. */
static int fp8_linear_backward(tt_node *node, tt_tensor *grad_out) {
  tt_fp8_linear_state *st = node->ctx;
  tt_tensor *x = node->inputs[0], *w = node->inputs[1], *bias = node->inputs[2];
  tt_tensor *xq = node->saved[0], *wq = node->saved[1];
  tt_tensor *gq = NULL, *g2 = NULL, *x2 = NULL, *dx = NULL, *dw = NULL, *db = NULL;
  int grad = tt_is_grad_enabled();
  int rc = -1;
  tt_set_grad_enabled(0);
  if (fake_quant_delayed("fp8_linear backward", grad_out, &st->g, &gq)) goto done;
  if (tt_needs_grad(x)) {
    /* dx (..., in) = gq (..., out) @ wq (out, in) */
    if (tt_matmul(gq, wq, NULL, 0, 0, &dx) || tt_accumulate_grad(x, dx)) goto done;
  }
  if (tt_needs_grad(w)) {
    /* dw (out, in) = gq^T (out, rows) @ xq (rows, in), rows = all leading dims */
    int64_t g_shape[2] = {-1, w->shape[0]}, x_shape[2] = {-1, w->shape[1]};
    if (tt_view(gq, g_shape, 2, &g2) || tt_view(xq, x_shape, 2, &x2) ||
        tt_matmul(g2, x2, NULL, 1, 0, &dw) || tt_accumulate_grad(w, dw))
      goto done;
  }
  if (bias && tt_needs_grad(bias)) {
    /* The bias gradient needs no GEMM, so it takes the unquantised gradient. */
    int dims[TT_MAX_DIMS];
    for (int d = 0; d < grad_out->ndim - 1; d++) dims[d] = d;
    if (grad_out->ndim == 1) {
      if (tt_accumulate_grad(bias, grad_out)) goto done;
    } else if (tt_sum(grad_out, dims, grad_out->ndim - 1, 0, &db) ||
               tt_accumulate_grad(bias, db)) {
      goto done;
    }
  }
  rc = 0;
done:
  tt_set_grad_enabled(grad);
  tt_tensor_release(gq);
  tt_tensor_release(g2);
  tt_tensor_release(x2);
  tt_tensor_release(dx);
  tt_tensor_release(dw);
  tt_tensor_release(db);
  return rc ? tt_error_context("fp8_linear backward") : 0;
}

int tt_fp8_linear(tt_tensor *x, tt_tensor *w, tt_tensor *bias, tt_fp8_linear_state *st,
                  tt_tensor **out) {
  TT_CHECK(x && w && st && out, "fp8_linear: x, w, state and out must not be NULL");
  TT_CHECK(w->ndim == 2, "fp8_linear: weight must be (out, in), got %d dims", w->ndim);
  TT_CHECK(x->ndim >= 1 && x->shape[x->ndim - 1] == w->shape[1],
           "fp8_linear: x's last dim (%lld) must equal the weight's in features (%lld)",
           (long long)(x->ndim ? x->shape[x->ndim - 1] : 0), (long long)w->shape[1]);
  tt_tensor *ins[3] = {x, w, bias};
  TT_TRY(tt_check_same_device("fp8_linear", ins, bias ? 3 : 2));
  tt_tensor *xq = NULL, *wq = NULL, *y = NULL;
  int grad = tt_is_grad_enabled();
  tt_set_grad_enabled(0);
  int rc = fake_quant_delayed("fp8_linear", x, &st->x, &xq);
  if (!rc) rc = fake_quant_delayed("fp8_linear", w, &st->w, &wq);
  if (!rc) rc = tt_linear(xq, wq, bias, &y);
  tt_set_grad_enabled(grad);
  if (rc) goto fail;
  if (tt_should_record(ins, 3)) {
    tt_node *node = tt_record("fp8_linear", fp8_linear_backward, y, ins, 3);
    if (!node) goto fail;
    node->ctx = st;
    tt_node_save(node, xq);
    tt_node_save(node, wq);
  }
  tt_tensor_release(xq);
  tt_tensor_release(wq);
  *out = y;
  return 0;
fail:
  tt_tensor_release(xq);
  tt_tensor_release(wq);
  tt_tensor_release(y);
  return -1;
}

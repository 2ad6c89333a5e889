/*
** gpu_bench.c — GPU figures for tools/gpu-check, at the shapes of one Llama-7B layer
** (dim 4096, ffn 11008, 32 heads of 128, seq 4096, batch 1):
**   1. its four GEMMs (x W^T, M = seq): cuBLAS (cublasGemmEx, bf16, fp32 compute) as
**      the reference; our cuBLASLt call (tt_cuda_lt_gemm) in bf16 and in FP8 (e4m3,
**      per-tensor scales); and the engine op of train.precision = bf16
**      (tt_cuda_linear_lowp: f32 x and W rounded to bf16 inside, f32 out);
**   2. the engine's causal attention in bf16, forward + backward (cuDNN's fused
**      attention when it loads, else our kernel);
**   3. the whole layer forward + backward as train.precision = bf16 runs it (bf16
**      activations between the GEMMs, q/k/v and w1 | w3 each one GEMM, the residual add
**      fused with the norm: run_layer below), and its MFU against the dense bf16 peak;
**      then one more run under the op profile (tt_op_profile_*: CUDA events at the tape's
**      marks), the ops that took longest: where the time beyond the GEMMs goes.
** Each figure is the median of timed repeats after warm-ups, from CUDA events; inputs are
** random, never zeros. FLOP counts are the model's (causal attention counted half, the
** backward twice the forward), so MFU compares with other frameworks' figures.
**
**   gpu_bench [PEAK_TFLOPS [SEQ]]     PEAK: dense bf16 TFLOP/s of the card (989: H100
**                                     and H200 SXM)
** Exit 77 without a GPU.
*/
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/tt_internal.h"
#include "tetra_cuda.h"
#include "cuda/tetra_cuda_lowp.h"
#include "tt_cuda_ops.h"

static void die(const char *what) {
  fprintf(stderr, "gpu_bench: %s: %s\n", what, tt_last_error());
  exit(1);
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Random contiguous device tensor (rounded to dtype from N(0, std) drawn on the CPU). */
static tt_tensor *rand_dev(const int64_t *shape, int ndim, int dtype, double std) {
  tt_tensor *h = NULL, *c = NULL, *d = NULL;
  if (tt_tensor_randn(shape, ndim, 0.0, std, &h) || tt_cast(h, dtype, &c) ||
      tt_to_device(c, 0, &d))
    die("random input");
  tt_tensor_release(h);
  tt_tensor_release(c);
  return d;
}

typedef int (*bench_fn)(void *ctx);

/* Median milliseconds of fn over `repeats` runs after `warmup` runs. */
static float time_ms(bench_fn fn, void *ctx, int warmup, int repeats) {
  tt_cuda_event *a, *b;
  float ms[64];
  if (repeats > 64) repeats = 64;
  if (tt_cuda_event_create(1, &a) || tt_cuda_event_create(1, &b)) die("events");
  for (int i = 0; i < warmup; i++)
    if (fn(ctx)) die("warm-up");
  if (tt_cuda_synchronize()) die("synchronize");
  for (int i = 0; i < repeats; i++) {
    if (tt_cuda_event_record(a, tt_cuda_get_stream())) die("event");
    if (fn(ctx)) die("timed run");
    if (tt_cuda_event_record(b, tt_cuda_get_stream()) || tt_cuda_event_synchronize(b) ||
        tt_cuda_event_elapsed_ms(a, b, &ms[i]))
      die("event");
  }
  tt_cuda_event_destroy(a);
  tt_cuda_event_destroy(b);
  qsort(ms, (size_t)repeats, sizeof ms[0], cmp_float);
  return ms[repeats / 2];
}

static double tflops(double flop, float ms) { return flop / (ms * 1e-3) / 1e12; }

/* -- 1. GEMMs ----------------------------------------------------------------------- */

typedef struct gemm_case {
  int64_t m, n, k;
  cublasHandle_t blas;
  tt_tensor *x16, *w16, *y16;     /* bf16 operands and output */
  tt_tensor *x8, *w8, *scale;     /* e4m3 operands, a device f32 scale */
  tt_tensor *x32, *w32;           /* f32 operands of the engine op */
  tt_cuda_gemm_args lt;
} gemm_case;

/* Row-major y (m, n) = x (m, k) W^T, W (n, k), is column-major y^T = W x^T: W read
** transposed (op T, ld k), x^T plainly (op N, ld k). */
static int run_cublas(void *ctx) {
  gemm_case *g = ctx;
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t s = cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)g->n, (int)g->m,
                                  (int)g->k, &one, tt_tensor_data(g->w16), CUDA_R_16BF,
                                  (int)g->k, tt_tensor_data(g->x16), CUDA_R_16BF, (int)g->k,
                                  &zero, tt_tensor_data(g->y16), CUDA_R_16BF, (int)g->n,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? 0 : tt_set_error("cublasGemmEx: %s",
                                                       cublasGetStatusString(s));
}

static int run_lt(void *ctx) { return tt_cuda_lt_gemm(&((gemm_case *)ctx)->lt); }

static int run_engine_op(void *ctx) {
  gemm_case *g = ctx;
  tt_tensor *y = NULL;
  int rc = tt_cuda_linear_lowp(g->x32, g->w32, NULL, TT_BF16, &y);
  tt_tensor_release(y);
  return rc;
}

/* The lt call y = x W^T for operands of dtype (bf16, or e4m3 with scales). FP8 on Hopper
** must be "TN" for cuBLASLt, which this call is after the row-major swap. */
static void set_lt(gemm_case *g, tt_tensor *x, tt_tensor *w, int dtype) {
  memset(&g->lt, 0, sizeof g->lt);
  g->lt.trans_a = 0; g->lt.trans_b = 1;
  g->lt.m = g->m; g->lt.n = g->n; g->lt.k = g->k;
  g->lt.a = tt_tensor_data(x); g->lt.lda = g->k; g->lt.a_dtype = dtype;
  g->lt.b = tt_tensor_data(w); g->lt.ldb = g->k; g->lt.b_dtype = dtype;
  g->lt.c = tt_tensor_data(g->y16); g->lt.ldc = g->n; g->lt.c_dtype = TT_BF16;
  g->lt.batch = 1;
  g->lt.alpha = 1.0f;
  if (dtype == TT_E4M3) g->lt.a_scale = g->lt.b_scale = tt_tensor_data(g->scale);
}

typedef struct gemm_totals { double cublas, lt16, op, lt8, lt8f; } gemm_totals;

static void bench_gemm(cublasHandle_t blas, const char *name, int64_t m, int64_t n, int64_t k,
                       gemm_totals *tot) {
  gemm_case g;
  memset(&g, 0, sizeof g);
  g.m = m; g.n = n; g.k = k; g.blas = blas;
  int64_t xs[2] = {m, k}, ws[2] = {n, k}, ys[2] = {m, n};
  g.x32 = rand_dev(xs, 2, TT_F32, 1.0);
  g.w32 = rand_dev(ws, 2, TT_F32, 0.02);
  if (tt_cast(g.x32, TT_BF16, &g.x16) || tt_cast(g.w32, TT_BF16, &g.w16)) die("cast");
  /* fp8 operands scaled into e4m3's range (x * 50 for N(0, 1)), descaled by the GEMM. */
  g.x8 = rand_dev(xs, 2, TT_E4M3, 50.0);
  g.w8 = rand_dev(ws, 2, TT_E4M3, 50.0);
  int64_t one = 1;
  if (tt_tensor_full(&one, 1, TT_F32, 0, 1.0 / 50.0, &g.scale)) die("scale");
  g.y16 = rand_dev(ys, 2, TT_BF16, 1.0);
  const double flop = 2.0 * m * n * k;
  float ms_blas = time_ms(run_cublas, &g, 3, 15);
  set_lt(&g, g.x16, g.w16, TT_BF16);
  float ms_lt = time_ms(run_lt, &g, 3, 15);
  float ms_op = time_ms(run_engine_op, &g, 3, 15);
  set_lt(&g, g.x8, g.w8, TT_E4M3);
  float ms_fp8 = time_ms(run_lt, &g, 3, 15);
  g.lt.fast_accum = 1;   /* train.fp8_fast_accum: the forward GEMM's option */
  float ms_fast = time_ms(run_lt, &g, 3, 15);
  printf("| %-24s | %7.1f | %7.1f | %7.1f | %7.1f | %7.1f | %5.2fx |\n", name,
         tflops(flop, ms_blas), tflops(flop, ms_lt), tflops(flop, ms_op), tflops(flop, ms_fp8),
         tflops(flop, ms_fast), ms_lt / ms_fp8);
  tot->cublas += ms_blas; tot->lt16 += ms_lt; tot->op += ms_op; tot->lt8 += ms_fp8;
  tot->lt8f += ms_fast;
  tt_tensor *all[] = {g.x16, g.w16, g.y16, g.x8, g.w8, g.scale, g.x32, g.w32};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

/* -- 2 and 3. Attention and the layer ------------------------------------------------ */

enum { D = 4096, FF = 11008, H = 32, DH = 128 };

typedef struct layer {
  int64_t T;
  tt_tensor *x, *gout;                         /* (1, T, D) */
  tt_tensor *norm1, *norm2;                    /* (D) */
  tt_tensor *wq, *wk, *wv, *wo, *w1, *w3, *w2;
  tt_tensor *q, *k, *v, *gq;                   /* attention alone: (1, T, H, DH) */
} layer;

#define STEP(expr) do { if ((expr) != 0) goto done; } while (0)

/* A contiguous (1, T, n*DH) or a column block of one (a fused GEMM's output) as heads. */
static int heads(tt_tensor *flat, int64_t T, tt_tensor **out) {
  int64_t s[4] = {1, T, flat->shape[2] / DH, DH};
  return tt_reshape(flat, s, 4, out);
}

/* Pre-norm Llama block as train.precision = bf16 runs it (lua/tetra/nn/transformer.lua):
** RMSNorm writing bf16, q/k/v in one GEMM writing bf16 (tt_linear_lowp_group), RoPE and
** attention in bf16 (cuDNN's fused attention when it loads), the output projection
** writing f32 into the f32 residual stream, the residual add fused with the second norm,
** w1 | w3 in one GEMM, bf16 SwiGLU, the down projection writing f32, the last residual
** add. Forward, then backward from gout; every intermediate is released as soon as the
** tape holds it. The weights' bf16 copies are made at the first call and reused, as
** between two optimizer steps. */
static int run_layer(void *ctx) {
  layer *L = ctx;
  const int64_t T = L->T;
  int64_t flat[3] = {1, T, D};
  int rc = -1;
  tt_tensor *x0 = NULL, *h = NULL, *qkv[3] = {NULL, NULL, NULL}, *q = NULL, *k = NULL;
  tt_tensor *v = NULL, *qr = NULL, *kr = NULL, *a = NULL, *a2 = NULL, *o = NULL, *x1 = NULL;
  tt_tensor *h2 = NULL, *gu[2] = {NULL, NULL}, *s = NULL, *y = NULL, *out = NULL;
  tt_tensor *wqkv[3] = {L->wq, L->wk, L->wv}, *w13[2] = {L->w1, L->w3};
  STEP(tt_add_rms_norm(L->x, NULL, L->norm1, 1e-5, TT_BF16, &x0, &h));
  STEP(tt_linear_lowp_group(h, wqkv, NULL, 3, TT_BF16, TT_BF16, qkv));
  STEP(heads(qkv[0], T, &q));
  STEP(heads(qkv[1], T, &k));
  STEP(heads(qkv[2], T, &v));
  STEP(tt_rope(q, NULL, 10000.0, 0, &qr));
  STEP(tt_rope(k, NULL, 10000.0, 0, &kr));
  STEP(tt_attention(qr, kr, v, 1, 0.0, &a));
  STEP(tt_view(a, flat, 3, &a2));
  STEP(tt_linear_lowp_ex(a2, L->wo, NULL, TT_BF16, TT_F32, &o));
  STEP(tt_add_rms_norm(L->x, o, L->norm2, 1e-5, TT_BF16, &x1, &h2));
  STEP(tt_linear_lowp_group(h2, w13, NULL, 2, TT_BF16, TT_BF16, gu));
  STEP(tt_swiglu(gu[0], gu[1], &s));
  STEP(tt_linear_lowp_ex(s, L->w2, NULL, TT_BF16, TT_F32, &y));
  STEP(tt_add(x1, y, &out));
  STEP(tt_backward_with(out, L->gout));
  rc = 0;
done:;
  tt_tensor *all[] = {x0, h, qkv[0], qkv[1], qkv[2], q, k, v, qr, kr, a, a2, o, x1, h2,
                      gu[0], gu[1], s, y, out};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  tt_tensor *leaves[] = {L->x, L->norm1, L->norm2, L->wq, L->wk, L->wv, L->wo, L->w1,
                         L->w3, L->w2};
  for (size_t i = 0; i < sizeof leaves / sizeof leaves[0]; i++) tt_zero_grad(leaves[i]);
  if (rc != 0) tt_tape_clear();
  return rc;
}

/* fn once under the op profile: its `top` longest (op, phase) entries and the rest. */
static void op_table(int (*fn)(void *), void *ctx, int top, float ms_alone) {
  static const char *const phase[] = {"fwd", "bwd", "recompute", "outside",
                                               "region"};
  if (tt_op_profile_start(tt_cuda_current_device())) die("op profile start");
  if (fn(ctx)) die("the profiled run");
  double total = 0.0;
  int n = tt_op_profile_stop(&total);
  if (n < 0) die("op profile stop");
  tt_op_profile_entry e[256];
  n = tt_op_profile_take(e, 256);
  printf("the layer's time by op (one run under the op profile: %.2f ms, %.2f timed alone; "
         "each interval between two taped ops charged to the later one):\n",
         total * 1e3, ms_alone);
  printf("| %-28s | %-9s | %5s | %8s | %6s |\n", "op", "phase", "calls", "ms", "share");
  printf("|------------------------------|-----------|-------|----------|--------|\n");
  double rest = 0.0;
  for (int i = 0; i < n; i++) {
    if (i >= top) {
      rest += e[i].seconds;
      continue;
    }
    printf("| %-28s | %-9s | %5lld | %8.3f | %5.1f%% |\n", e[i].name, phase[e[i].phase],
           (long long)e[i].calls, e[i].seconds * 1e3, 100.0 * e[i].seconds / total);
  }
  if (n > top)
    printf("| (%d more) %18s | %-9s | %5s | %8.3f | %5.1f%% |\n", n - top, "", "", "",
           rest * 1e3, 100.0 * rest / total);
}

static int run_attention(void *ctx) {
  layer *L = ctx;
  tt_tensor *o = NULL;
  if (tt_attention(L->q, L->k, L->v, 1, 0.0, &o)) return -1;
  int rc = tt_backward_with(o, L->gq);
  tt_tensor_release(o);
  tt_zero_grad(L->q);
  tt_zero_grad(L->k);
  tt_zero_grad(L->v);
  return rc;
}

static tt_tensor *param(const int64_t *shape, int ndim, double std) {
  tt_tensor *t = rand_dev(shape, ndim, TT_F32, std);
  if (tt_set_requires_grad(t, 1)) die("requires_grad");
  return t;
}

/* A bf16 leaf that requires grad (attention's q, k, v as the layer feeds them). */
static tt_tensor *bf16_param(const int64_t *shape, int ndim) {
  tt_tensor *t = rand_dev(shape, ndim, TT_BF16, 1.0);
  if (tt_set_requires_grad(t, 1)) die("requires_grad");
  return t;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);   /* a run stopped at its time cap keeps its lines */
  double peak = argc > 1 ? atof(argv[1]) : 989.0;
  int64_t T = argc > 2 ? atoll(argv[2]) : 4096;
  if (tt_cuda_init()) {
    printf("SKIP: %s\n", tt_last_error());
    return 77;
  }
  char info[256];
  if (tt_cuda_device_info(tt_cuda_current_device(), info, sizeof info)) die("device info");
  printf("device: %s; dense bf16 peak taken as %.0f TFLOP/s\n\n", info, peak);
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) die("cublasCreate");

  /* 1. GEMMs, TFLOP/s per implementation. */
  printf("GEMMs y = x W^T, M = %lld, TFLOP/s (fp8 x: bf16 lt time / fp8 lt time)\n",
         (long long)T);
  printf("| %-24s | %7s | %7s | %7s | %7s | %7s | %6s |\n", "shape (N x K)", "cuBLAS",
         "lt bf16", "op bf16", "lt fp8", "fp8 fast", "fp8 x");
  printf("|--------------------------|---------|---------|---------|---------|---------|"
         "--------|\n");
  struct { const char *name; int64_t n, k; } shapes[] = {
    {"qkv  12288 x 4096", 3 * D, D}, {"wo    4096 x 4096", D, D},
    {"w1w3 22016 x 4096", 2 * FF, D}, {"w2    4096 x 11008", D, FF},
  };
  gemm_totals tot = {0, 0, 0, 0, 0};
  for (int i = 0; i < 4; i++) bench_gemm(blas, shapes[i].name, T, shapes[i].n, shapes[i].k, &tot);
  const double gemm_flop = 2.0 * T * (4.0 * D * D + 3.0 * D * FF);
  printf("| %-24s | %7.1f | %7.1f | %7.1f | %7.1f | %7.1f | %5.2fx |\n", "layer forward GEMMs",
         tflops(gemm_flop, (float)tot.cublas), tflops(gemm_flop, (float)tot.lt16),
         tflops(gemm_flop, (float)tot.op), tflops(gemm_flop, (float)tot.lt8),
         tflops(gemm_flop, (float)tot.lt8f), tot.lt16 / tot.lt8);
  printf("lt bf16 / cuBLAS time: %.3f; fp8 speed-up over bf16 %.2fx, with fast accumulation "
         "%.2fx (goal 1.6x)\n\n", tot.lt16 / tot.cublas, tot.lt16 / tot.lt8, tot.lt16 / tot.lt8f);
  cublasDestroy(blas);

  /* 2. Attention alone, then 3. the layer. */
  layer L;
  memset(&L, 0, sizeof L);
  L.T = T;
  int64_t hs[4] = {1, T, H, DH}, xs[3] = {1, T, D}, dv[1] = {D};
  int64_t sq[2] = {D, D}, s13[2] = {FF, D}, s2[2] = {D, FF};
  L.q = bf16_param(hs, 4); L.k = bf16_param(hs, 4); L.v = bf16_param(hs, 4);
  L.gq = rand_dev(hs, 4, TT_BF16, 1.0);
  const double attn_flop = 6.0 * (double)T * T * D;   /* fwd 2 T^2 D (causal), bwd 2x */
  float ms_attn = time_ms(run_attention, &L, 1, 5);
  printf("attention (bf16, as the layer runs it) causal fwd+bwd T=%lld 32x128: %.2f ms, "
         "%.1f TFLOP/s\n", (long long)T, ms_attn, tflops(attn_flop, ms_attn));
  tt_tensor_release(L.q); tt_tensor_release(L.k); tt_tensor_release(L.v);
  tt_tensor_release(L.gq);
  L.q = L.k = L.v = L.gq = NULL;

  L.x = param(xs, 3, 1.0);
  L.gout = rand_dev(xs, 3, TT_F32, 1.0);
  L.norm1 = param(dv, 1, 1.0); L.norm2 = param(dv, 1, 1.0);
  L.wq = param(sq, 2, 0.02); L.wk = param(sq, 2, 0.02); L.wv = param(sq, 2, 0.02);
  L.wo = param(sq, 2, 0.02);
  L.w1 = param(s13, 2, 0.02); L.w3 = param(s13, 2, 0.02); L.w2 = param(s2, 2, 0.02);
  float ms_layer = time_ms(run_layer, &L, 2, 7);
  const double layer_flop = 3.0 * gemm_flop + attn_flop;
  const double layer_tf = tflops(layer_flop, ms_layer);
  printf("layer (train.precision=bf16: bf16 activations, fused q/k/v and w1|w3) fwd+bwd "
         "T=%lld: %.2f ms, %.1f TFLOP/s, MFU %.1f%% (goal 45%%); "
         "attention %.0f%% of the time\n",
         (long long)T, ms_layer, layer_tf, 100.0 * layer_tf / peak, 100.0 * ms_attn / ms_layer);
  op_table(run_layer, &L, 20, ms_layer);
  tt_tensor *all[] = {L.x, L.gout, L.norm1, L.norm2, L.wq, L.wk, L.wv, L.wo, L.w1, L.w3, L.w2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  return 0;
}

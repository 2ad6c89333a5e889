/*
** gpu_bench.c — GPU figures for tools/gpu-check: the GEMMs of one Llama-7B layer (dim
** 4096, ffn 11008, seq 4096, batch 1) through cuBLASLt in bf16 and FP8 (e4m3, per-tensor
** scales), and the engine's f32 attention forward + backward at the layer's shape
** (32 heads of 128). Each figure is the median of timed repeats after a warm-up, from
** CUDA events; inputs are random, never zeros.
**
** Prints one table row per case: name, ms, TFLOP/s, and the fraction of the dense bf16
** peak given as argv[1] in TFLOP/s (989 for H100/H200 SXM).
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tt_internal.h"
#include "tetra_cuda.h"
#include "cuda/tt_cuda_ops.h"

enum { REPEATS = 20 };

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Random device tensor of n elements in dtype (rounded from N(0, std)). */
static tt_tensor *rand_dev(int64_t n, int dtype, double std) {
  tt_tensor *h = NULL, *c = NULL, *d = NULL;
  if (tt_tensor_randn(&n, 1, 0.0, std, &h) || tt_cast(h, dtype, &c) ||
      tt_to_device(c, 0, &d)) {
    fprintf(stderr, "gpu_bench: %s\n", tt_last_error());
    exit(1);
  }
  tt_tensor_release(h);
  tt_tensor_release(c);
  return d;
}

typedef int (*bench_fn)(void *ctx);

/* Median milliseconds of fn over REPEATS runs after 3 warm-ups. */
static float time_ms(bench_fn fn, void *ctx) {
  tt_cuda_event *a, *b;
  float ms[REPEATS];
  if (tt_cuda_event_create(1, &a) || tt_cuda_event_create(1, &b)) exit(1);
  for (int i = 0; i < 3; i++)
    if (fn(ctx)) { fprintf(stderr, "gpu_bench: %s\n", tt_last_error()); exit(1); }
  for (int i = 0; i < REPEATS; i++) {
    tt_cuda_event_record(a, tt_cuda_get_stream());
    if (fn(ctx)) { fprintf(stderr, "gpu_bench: %s\n", tt_last_error()); exit(1); }
    tt_cuda_event_record(b, tt_cuda_get_stream());
    tt_cuda_event_synchronize(b);
    tt_cuda_event_elapsed_ms(a, b, &ms[i]);
  }
  tt_cuda_event_destroy(a);
  tt_cuda_event_destroy(b);
  qsort(ms, REPEATS, sizeof ms[0], cmp_float);
  return ms[REPEATS / 2];
}

/* -- GEMMs -------------------------------------------------------------------------- */

typedef struct gemm_case {
  const char *name;
  int64_t m, n, k;
  tt_cuda_gemm_args args;
} gemm_case;

static int run_gemm(void *ctx) { return tt_cuda_lt_gemm(&((gemm_case *)ctx)->args); }

/* y (m, n) = x (m, k) @ W^T, W (n, k): the forward of a Linear in row-major terms. FP8
** operands on Hopper must be "TN" for cuBLASLt, which this call is after the row-major
** swap (W transposed, x not). */
static double bench_gemm(const char *name, int64_t m, int64_t n, int64_t k, int dtype,
                         double peak) {
  gemm_case g;
  memset(&g, 0, sizeof g);
  g.name = name;
  int fp8 = dtype == TT_E4M3;
  tt_tensor *x = rand_dev(m * k, dtype, fp8 ? 50.0 : 1.0), *w = rand_dev(n * k, dtype, fp8 ? 50.0 : 1.0);
  tt_tensor *y = rand_dev(m * n, TT_BF16, 1.0);
  tt_tensor *scale = NULL;
  int64_t one = 1;
  tt_tensor *sh = NULL;
  if (tt_tensor_full(&one, 1, TT_F32, TT_CPU, 1.0 / 50.0, &sh) || tt_to_device(sh, 0, &scale)) exit(1);
  g.args.trans_a = 0; g.args.trans_b = 1;
  g.args.m = m; g.args.n = n; g.args.k = k;
  g.args.a = tt_tensor_data(x); g.args.lda = k; g.args.a_dtype = dtype;
  g.args.b = tt_tensor_data(w); g.args.ldb = k; g.args.b_dtype = dtype;
  g.args.c = tt_tensor_data(y); g.args.ldc = n; g.args.c_dtype = TT_BF16;
  g.args.batch = 1;
  g.args.alpha = 1.0f;
  if (fp8) {
    g.args.a_scale = tt_tensor_data(scale);
    g.args.b_scale = tt_tensor_data(scale);
  }
  float ms = time_ms(run_gemm, &g);
  double tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12;
  printf("| %-34s | %8.3f | %7.1f | %5.1f%% |\n", name, ms, tflops, 100.0 * tflops / peak);
  tt_tensor_release(x); tt_tensor_release(w); tt_tensor_release(y);
  tt_tensor_release(scale); tt_tensor_release(sh);
  return ms;
}

/* -- Attention ---------------------------------------------------------------------- */

typedef struct attn_case { tt_tensor *q, *k, *v, *g; } attn_case;

static int run_attention(void *ctx) {
  attn_case *a = ctx;
  tt_tensor *o = NULL;
  if (tt_attention(a->q, a->k, a->v, 1, 0.0, &o)) return -1;
  int rc = tt_backward_with(o, a->g);
  tt_tensor_release(o);
  tt_zero_grad(a->q); tt_zero_grad(a->k); tt_zero_grad(a->v);
  return rc;
}

int main(int argc, char **argv) {
  double peak = argc > 1 ? atof(argv[1]) : 989.0;
  int64_t seq = argc > 2 ? atoll(argv[2]) : 4096;
  if (tt_cuda_init()) {
    printf("SKIP: %s\n", tt_last_error());
    return 77;
  }
  char info[256];
  tt_cuda_device_info(tt_cuda_current_device(), info, sizeof info);
  printf("device: %s; dense bf16 peak taken as %.0f TFLOP/s\n\n", info, peak);
  printf("| %-34s | %8s | %7s | %6s |\n", "case", "ms", "TFLOP/s", "peak");
  printf("|%s|%s|%s|%s|\n", "------------------------------------", "----------", "---------",
         "--------");
  const int64_t D = 4096, FF = 11008;
  struct { const char *name; int64_t n, k; } shapes[] = {
    {"qkv  (4096 -> 3x4096)", 3 * D, D}, {"wo   (4096 -> 4096)", D, D},
    {"w1w3 (4096 -> 2x11008)", 2 * FF, D}, {"w2   (11008 -> 4096)", D, FF},
  };
  double bf16_ms = 0, fp8_ms = 0;
  char name[64];
  for (int i = 0; i < 4; i++) {
    snprintf(name, sizeof name, "bf16 %s", shapes[i].name);
    bf16_ms += bench_gemm(name, seq, shapes[i].n, shapes[i].k, TT_BF16, peak);
    snprintf(name, sizeof name, "fp8  %s", shapes[i].name);
    fp8_ms += bench_gemm(name, seq, shapes[i].n, shapes[i].k, TT_E4M3, peak);
  }
  printf("\nlayer forward GEMMs: bf16 %.3f ms, fp8 %.3f ms, fp8 speed-up %.2fx (target 1.5x)\n",
         bf16_ms, fp8_ms, bf16_ms / fp8_ms);

  /* Attention at the layer's shape; f32 on CUDA cores (the engine's kernel today). */
  int64_t T = seq < 1024 ? seq : 1024;
  int64_t qs[4] = {1, T, 32, 128};
  attn_case a;
  tt_tensor *hq = NULL;
  int64_t n = T * 32 * 128;
  a.q = rand_dev(n, TT_F32, 1.0); a.k = rand_dev(n, TT_F32, 1.0);
  a.v = rand_dev(n, TT_F32, 1.0); a.g = rand_dev(n, TT_F32, 1.0);
  tt_tensor *views[4] = {a.q, a.k, a.v, a.g};
  for (int i = 0; i < 4; i++) {
    tt_tensor *vw = NULL;
    if (tt_view(views[i], qs, 4, &vw)) { fprintf(stderr, "%s\n", tt_last_error()); return 1; }
    tt_tensor_release(views[i]);
    views[i] = vw;
  }
  a.q = views[0]; a.k = views[1]; a.v = views[2]; a.g = views[3];
  tt_set_requires_grad(a.q, 1); tt_set_requires_grad(a.k, 1); tt_set_requires_grad(a.v, 1);
  float ms = time_ms(run_attention, &a);
  /* causal: half of 4 T^2 Dh H flops forward, 2.5x that for backward */
  double flops = 3.5 * 4.0 * T * T * 128.0 * 32 / 2.0;
  printf("\nattention f32 fwd+bwd causal, T=%lld, 32x128: %.3f ms, %.2f TFLOP/s\n",
         (long long)T, ms, flops / (ms * 1e-3) / 1e12);
  (void)hq;
  for (int i = 0; i < 4; i++) tt_tensor_release(views[i]);
  return 0;
}

/*
** engine.c — the engine benchmark of issue 2. In one run it measures OpenBLAS sgemm's own
** GFLOP/s on this machine (a large square product, the peak every other row is divided
** by, and the GEMM shapes of the benchmark model), then the engine's matmul (tt_linear),
** attention and a full Llama block, forward and forward + backward, and the lazy draw of
** a rank's slice of a weight against the whole one's, and prints one table.
**
** Build and run with tools/bench/engine (it links the CMake build's engine library).
** Options: --reps N (timed repetitions; default 10), --quick (3 runs, 1024^3 peak).
** Rows report the best and the median run; GFLOP/s and the share of the peak use the best.
**
** FLOP counts (only the products; norms, RoPE, SwiGLU and adds are free riders):
**   GEMM (m, n, k): 2 m n k; backward of a linear: twice its forward.
**   causal attention forward: 4 B H T^2 Dh / 2 (QK^T and PV on the visible half);
**   backward: 2.5 times the forward (FlashAttention-2's convention: five block products
**   against two, the recomputation of QK^T included).
** The Llama block: dim 256, 4 heads (Dh 64), SwiGLU hidden 768, seq 256, batch 8:
**   RMSNorm, q/k/v linears, RoPE on q and k, causal attention, o-proj, residual add,
**   RMSNorm, gate/up linears, SwiGLU, down linear, residual add.
*/
#include "tetra.h"
#include "common/cpu.h"
#include "common/preinit_env.h"
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_reps = 10;
static double g_peak;   /* GFLOP/s of the large square sgemm */

static double now(void) { return omp_get_wtime(); }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef int (*bench_fn)(void *ctx);

/* Best and median seconds of `reps` calls after `warmup` untimed ones; best < 0 on
** failure. The best run is what the machine can do; the median shows how much the other
** tenants of a shared machine took away. */
typedef struct timing {
  double best, median;
} timing;

static timing time_runs(bench_fn fn, void *ctx, int warmup, int reps) {
  double t[256];
  timing r = {-1.0, -1.0};
  if (reps > 256) reps = 256;
  for (int i = 0; i < warmup; i++)
    if (fn(ctx) != 0) return r;
  for (int i = 0; i < reps; i++) {
    double t0 = now();
    if (fn(ctx) != 0) return r;
    t[i] = now() - t0;
  }
  qsort(t, (size_t)reps, sizeof(double), cmp_double);
  r.best = t[0];
  r.median = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
  return r;
}

static void row(const char *name, const char *shape, timing t, double flops) {
  if (t.best < 0) {
    printf("%-28s %-26s   failed: %s\n", name, shape, tt_last_error());
    return;
  }
  double gflops = flops / t.best / 1e9;
  printf("%-28s %-26s %9.3f %9.3f %9.1f %7.1f%%\n", name, shape, t.best * 1e3,
         t.median * 1e3, gflops, g_peak > 0 ? 100.0 * gflops / g_peak : 100.0);
}

static void header(const char *title) {
  printf("\n%-28s %-26s %9s %9s %9s %8s\n", title, "shape", "best ms", "median", "GFLOP/s",
         "of peak");
}

/* -- OpenBLAS sgemm ------------------------------------------------------------------- */

typedef struct sgemm_case {
  int trans_a, trans_b;
  int m, n, k;
  float *a, *b, *c;
} sgemm_case;

static int run_sgemm(void *p) {
  sgemm_case *s = p;
  cblas_sgemm(CblasRowMajor, s->trans_a ? CblasTrans : CblasNoTrans,
              s->trans_b ? CblasTrans : CblasNoTrans, s->m, s->n, s->k, 1.0f, s->a,
              s->trans_a ? s->m : s->k, s->b, s->trans_b ? s->k : s->n, 0.0f, s->c, s->n);
  return 0;
}

static double bench_sgemm(const char *name, int trans_a, int trans_b, int m, int n, int k) {
  sgemm_case s = {trans_a, trans_b, m, n, k, NULL, NULL, NULL};
  s.a = malloc(sizeof(float) * (size_t)m * k);
  s.b = malloc(sizeof(float) * (size_t)k * n);
  s.c = malloc(sizeof(float) * (size_t)m * n);
  timing t = {-1.0, -1.0};
  if (s.a && s.b && s.c) {
    for (size_t i = 0; i < (size_t)m * k; i++) s.a[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)k * n; i++) s.b[i] = (float)((i * 5) % 11) * 0.01f;
    t = time_runs(run_sgemm, &s, 2, g_reps);
  }
  char shape[64];
  snprintf(shape, sizeof shape, "%dx%dx%d %s%s", m, n, k, trans_a ? "T" : "N",
           trans_b ? "T" : "N");
  double flops = 2.0 * m * n * k;
  if (name) row(name, shape, t, flops);
  free(s.a);
  free(s.b);
  free(s.c);
  return t.best > 0 ? flops / t.best / 1e9 : 0.0;
}

/* -- Engine ops ----------------------------------------------------------------------- */

static tt_tensor *randn(const int64_t *shape, int ndim, double std, int requires_grad) {
  tt_tensor *t = NULL;
  if (tt_tensor_randn(shape, ndim, 0.0, std, &t) != 0) {
    fprintf(stderr, "bench: %s\n", tt_last_error());
    exit(1);
  }
  if (requires_grad) tt_set_requires_grad(t, 1);
  return t;
}

/* y = x W^T, optionally with backward. */
typedef struct linear_case {
  tt_tensor *x, *w, *gy;
  int backward;
} linear_case;

static int run_linear(void *p) {
  linear_case *c = p;
  tt_tensor *y = NULL;
  int rc = tt_linear(c->x, c->w, NULL, &y);
  if (rc == 0 && c->backward) rc = tt_backward_with(y, c->gy);
  tt_tensor_release(y);
  if (c->backward) {
    tt_zero_grad(c->x);
    tt_zero_grad(c->w);
  }
  return rc;
}

static void bench_linear(int64_t m, int64_t n, int64_t k) {
  int64_t xs[2] = {m, k}, ws[2] = {n, k}, ys[2] = {m, n};
  char shape[64];
  snprintf(shape, sizeof shape, "x %lldx%lld, W %lldx%lld", (long long)m, (long long)k,
           (long long)n, (long long)k);
  for (int backward = 0; backward < 2; backward++) {
    linear_case c = {randn(xs, 2, 1.0, backward), randn(ws, 2, 0.05, backward),
                     randn(ys, 2, 1.0, 0), backward};
    tt_set_grad_enabled(backward);
    timing t = time_runs(run_linear, &c, 2, g_reps);
    tt_set_grad_enabled(1);
    row(backward ? "  linear fwd+bwd" : "  linear fwd", shape, t,
        (backward ? 3.0 : 1.0) * 2.0 * m * n * k);
    tt_tensor_release(c.x);
    tt_tensor_release(c.w);
    tt_tensor_release(c.gy);
  }
}

typedef struct attention_case {
  tt_tensor *q, *k, *v, *gout;
  int backward;
} attention_case;

static int run_attention(void *p) {
  attention_case *c = p;
  tt_tensor *o = NULL;
  int rc = tt_attention(c->q, c->k, c->v, 1, 0.0, &o);
  if (rc == 0 && c->backward) rc = tt_backward_with(o, c->gout);
  tt_tensor_release(o);
  if (c->backward) {
    tt_zero_grad(c->q);
    tt_zero_grad(c->k);
    tt_zero_grad(c->v);
  }
  return rc;
}

static void bench_attention(int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t dh) {
  int64_t qs[4] = {b, t, hq, dh}, ks[4] = {b, t, hkv, dh};
  char shape[64];
  snprintf(shape, sizeof shape, "B%lld T%lld H%lld/%lld Dh%lld", (long long)b, (long long)t,
           (long long)hq, (long long)hkv, (long long)dh);
  double fwd = 4.0 * b * hq * t * t * dh / 2.0;
  for (int backward = 0; backward < 2; backward++) {
    attention_case c = {randn(qs, 4, 1.0, backward), randn(ks, 4, 1.0, backward),
                        randn(ks, 4, 1.0, backward), randn(qs, 4, 1.0, 0), backward};
    tt_set_grad_enabled(backward);
    timing s = time_runs(run_attention, &c, 2, g_reps);
    tt_set_grad_enabled(1);
    row(backward ? "  attention fwd+bwd" : "  attention fwd", shape, s,
        backward ? 3.5 * fwd : fwd);
    tt_tensor_release(c.q);
    tt_tensor_release(c.k);
    tt_tensor_release(c.v);
    tt_tensor_release(c.gout);
  }
}

/* -- Llama block ---------------------------------------------------------------------- */

enum { W_NORM1, W_Q, W_K, W_V, W_O, W_NORM2, W_GATE, W_UP, W_DOWN, W_COUNT };

typedef struct llama_block {
  int64_t b, t, dim, heads, ffn;
  tt_tensor *x, *gout, *w[W_COUNT];
  int backward;
} llama_block;

/* One forward (and backward) of the block; every temporary is released. */
static int run_block(void *p) {
  llama_block *L = p;
  const int64_t dh = L->dim / L->heads;
  int64_t s4[4] = {L->b, L->t, L->heads, dh}, s3[3] = {L->b, L->t, L->dim};
  enum { N1, Q, K, V, Q4, K4, V4, QR, KR, ATT, ATT3, O, H, N2, G, U, S, DN, OUT, NT };
  tt_tensor *t[NT] = {NULL};
  tt_tensor **w = L->w;
  int rc = -1;
  if (tt_rmsnorm(L->x, w[W_NORM1], 1e-5, &t[N1]) || tt_linear(t[N1], w[W_Q], NULL, &t[Q]) ||
      tt_linear(t[N1], w[W_K], NULL, &t[K]) || tt_linear(t[N1], w[W_V], NULL, &t[V]) ||
      tt_view(t[Q], s4, 4, &t[Q4]) || tt_view(t[K], s4, 4, &t[K4]) ||
      tt_view(t[V], s4, 4, &t[V4]) || tt_rope(t[Q4], NULL, 10000.0, 0, &t[QR]) ||
      tt_rope(t[K4], NULL, 10000.0, 0, &t[KR]) ||
      tt_attention(t[QR], t[KR], t[V4], 1, 0.0, &t[ATT]) ||
      tt_view(t[ATT], s3, 3, &t[ATT3]) || tt_linear(t[ATT3], w[W_O], NULL, &t[O]) ||
      tt_add(L->x, t[O], &t[H]) || tt_rmsnorm(t[H], w[W_NORM2], 1e-5, &t[N2]) ||
      tt_linear(t[N2], w[W_GATE], NULL, &t[G]) || tt_linear(t[N2], w[W_UP], NULL, &t[U]) ||
      tt_swiglu(t[G], t[U], &t[S]) || tt_linear(t[S], w[W_DOWN], NULL, &t[DN]) ||
      tt_add(t[H], t[DN], &t[OUT]))
    goto done;
  if (L->backward && tt_backward_with(t[OUT], L->gout) != 0) goto done;
  rc = 0;
done:
  if (rc != 0) tt_tape_clear();
  for (int i = 0; i < NT; i++) tt_tensor_release(t[i]);
  if (L->backward) {
    tt_zero_grad(L->x);
    for (int i = 0; i < W_COUNT; i++) tt_zero_grad(w[i]);
  }
  return rc;
}

static void bench_block(int64_t b, int64_t t, int64_t dim, int64_t heads, int64_t ffn) {
  int64_t xs[3] = {b, t, dim}, d1[1] = {dim}, dd[2] = {dim, dim};
  int64_t up[2] = {ffn, dim}, down[2] = {dim, ffn};
  const int64_t *shapes[W_COUNT] = {d1, dd, dd, dd, dd, d1, up, up, down};
  const int ndims[W_COUNT] = {1, 2, 2, 2, 2, 1, 2, 2, 2};
  double tokens = (double)b * t, dh = (double)dim / heads;
  double linear = 2.0 * tokens * (4.0 * dim * dim + 3.0 * dim * ffn);
  double attention = 4.0 * b * heads * t * t * dh / 2.0;
  char shape[64];
  snprintf(shape, sizeof shape, "B%lld T%lld d%lld H%lld f%lld", (long long)b, (long long)t,
           (long long)dim, (long long)heads, (long long)ffn);
  for (int backward = 0; backward < 2; backward++) {
    llama_block L = {b, t, dim, heads, ffn, NULL, NULL, {NULL}, backward};
    L.x = randn(xs, 3, 1.0, backward);
    L.gout = randn(xs, 3, 1.0, 0);
    for (int i = 0; i < W_COUNT; i++) {
      L.w[i] = randn(shapes[i], ndims[i], ndims[i] == 1 ? 0.0 : 0.02, 0);
      if (ndims[i] == 1) tt_fill_(L.w[i], 1.0);
      tt_set_requires_grad(L.w[i], backward);
    }
    tt_set_grad_enabled(backward);
    timing s = time_runs(run_block, &L, 2, g_reps);
    tt_set_grad_enabled(1);
    double flops = backward ? 3.0 * linear + 3.5 * attention : linear + attention;
    row(backward ? "  llama block fwd+bwd" : "  llama block fwd", shape, s, flops);
    if (s.best > 0)
      printf("%-28s %-26s %9.0f %9.0f tokens/s\n", "", "", tokens / s.best, tokens / s.median);
    tt_tensor_release(L.x);
    tt_tensor_release(L.gout);
    for (int i = 0; i < W_COUNT; i++) tt_tensor_release(L.w[i]);
  }
}

/* The tetra binary's choice of OpenBLAS kernels (engine/host/main.c), so that the peak
** measured here is the one training gets; OPENBLAS_CORETYPE set by the user wins. */
static void before_libraries(int argc, char **argv, char **envp) {
  (void)argc;
  (void)argv;
  tt_blas_core_choose_at_start(envp);
}
__attribute__((section(".preinit_array"), used)) static void (*const bench_preinit)(int, char **,
                                                                                    char **) =
    before_libraries;

/* -- Lazy initialisation ------------------------------------------------------------- */

/* A randn weight is drawn when first read (tetra.h): a rank that keeps a slice draws only
** its elements. Each row copies part of a lazy tensor out: the whole of it into f32 (one
** contiguous run, lazy_fill's threads), and as a tensor-parallel rank or a ZeRO-3 share
** (bf16, so through the view's draw): a row-parallel slice has many short rows, drawn a
** row per thread; a share is one long row, which must get every thread too. The ratio is
** the rate against the whole draw's. */
typedef struct lazy_case {
  tt_tensor *src, *dst;
} lazy_case;

static int run_lazy(void *p) {
  lazy_case *c = p;
  return tt_copy_(c->dst, c->src);
}

static double bench_lazy(const char *name, int how, double whole_rate) {
  const int64_t rows = 4096, cols = 4096, n = rows * cols;
  const int64_t shape[2] = {rows, cols}, flat[1] = {n};
  tt_tensor *w = NULL, *view = NULL, *dst = NULL;
  timing t = {-1.0, -1.0};
  int64_t count = 0;
  char shape_text[64] = "";
  if (tt_tensor_randn(shape, 2, 0.0, 0.02, &w) == 0) {
    int rc = 0;
    if (how == 0) {   /* the whole tensor */
      rc = tt_view(w, flat, 1, &view);
      count = n;
    } else if (how == 1) {   /* tp 4's row-parallel slice: a quarter of each row */
      rc = tt_narrow(w, 1, cols / 4, cols / 4, &view);
      count = n / 4;
    } else {   /* dp 4's ZeRO-3 share: a quarter of the flat tensor */
      tt_tensor *f = NULL;
      rc = tt_view(w, flat, 1, &f);
      if (rc == 0) rc = tt_narrow(f, 0, n / 4, n / 4, &view);
      tt_tensor_release(f);
      count = n / 4;
    }
    const int64_t out[1] = {count};
    if (rc == 0) rc = tt_tensor_empty(out, 1, how == 0 ? TT_F32 : TT_BF16, TT_CPU, &dst);
    tt_tensor *dst_view = NULL;
    if (rc == 0 && how == 1) {   /* the slice's own shape */
      const int64_t s2[2] = {rows, cols / 4};
      rc = tt_view(dst, s2, 2, &dst_view);
    }
    if (rc == 0) {
      lazy_case c = {view, dst_view ? dst_view : dst};
      t = time_runs(run_lazy, &c, 1, g_reps);
    }
    tt_tensor_release(dst_view);
  }
  snprintf(shape_text, sizeof shape_text, "%lld of %lldx%lld", (long long)count,
           (long long)rows, (long long)cols);
  double rate = t.best > 0 ? (double)count / t.best / 1e6 : 0.0;
  if (t.best < 0) {
    printf("%-28s %-26s   failed: %s\n", name, shape_text, tt_last_error());
  } else {
    printf("%-28s %-26s %9.3f %9.3f %9.1f %7.2fx\n", name, shape_text, t.best * 1e3,
           t.median * 1e3, rate, whole_rate > 0 ? rate / whole_rate : 1.0);
  }
  tt_tensor_release(dst);
  tt_tensor_release(view);
  tt_tensor_release(w);
  return rate;
}

int main(int argc, char **argv) {
  tt_preinit_restore();
  int square = 2048;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      g_reps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--quick")) {
      g_reps = 3;
      square = 1024;
    } else {
      fprintf(stderr, "usage: %s [--reps N] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (g_reps < 1) g_reps = 1;
  const char *wait = getenv("OMP_WAIT_POLICY");
  char core[256], weak[512];
  tt_blas_core_describe(tt_blas_core_choice_get(), openblas_get_corename(), core, sizeof core);
  printf("tetra engine benchmark: %d OpenMP threads (OMP_WAIT_POLICY=%s), %s with %d "
         "threads; %d timed runs per row\n",
         tt_get_num_threads(), wait ? wait : "unset", core, openblas_get_num_threads(), g_reps);
  if (tt_blas_core_warning(tt_blas_core_choice_get(), openblas_get_corename(), weak, sizeof weak))
    fprintf(stderr, "%s\n", weak);
  tt_manual_seed(1);

  const int64_t B = 8, T = 256, D = 256, H = 4, F = 768, N = B * T;
  header("OpenBLAS sgemm");
  g_peak = bench_sgemm(NULL, 0, 0, square, square, square);   /* warm the pool */
  g_peak = bench_sgemm("  square (peak)", 0, 0, square, square, square);
  bench_sgemm("  qkv/o proj  y = x W^T", 0, 1, (int)N, (int)D, (int)D);
  bench_sgemm("  gate/up     y = x W^T", 0, 1, (int)N, (int)F, (int)D);
  bench_sgemm("  down        y = x W^T", 0, 1, (int)N, (int)D, (int)F);
  bench_sgemm("  down dx     dx = dy W", 0, 0, (int)N, (int)F, (int)D);
  bench_sgemm("  down dW     dW = dy^T x", 1, 0, (int)D, (int)F, (int)N);

  header("engine matmul (tt_linear)");
  bench_linear(N, D, D);
  bench_linear(N, F, D);
  bench_linear(N, D, F);

  header("engine attention (causal)");
  bench_attention(B, T, H, H, D / H);
  bench_attention(B, T, H, H / 2, D / H);
  bench_attention(1, 1024, 8, 2, 64);

  header("engine llama block");
  bench_block(B, T, D, H, F);

  printf("\n%-28s %-26s %9s %9s %9s %8s\n", "lazy randn, drawn on read", "elements",
         "best ms", "median", "M/s", "of whole");
  double whole = bench_lazy("  whole tensor (f32)", 0, 0.0);
  bench_lazy("  tp 4 row slice (bf16)", 1, whole);
  bench_lazy("  dp 4 ZeRO-3 share (bf16)", 2, whole);
  return 0;
}

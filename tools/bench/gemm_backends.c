/*
** gemm_backends.c — the engine's f32 GEMM shapes on three CPU libraries side by side:
** OpenBLAS (what tetra links), BLIS and oneDNN's sgemm, each loaded with dlopen so that
** their `cblas_sgemm`s do not collide and none is a build dependency. Built and run by
** tools/bench/gemm_backends.sh, which installs BLIS and oneDNN for it.
**
** Shapes (row-major, as kernels/cpu/matmul.c and attention.c call cblas_sgemm): every
** Linear's three products, forward Y = X W^T (NT), input gradient dX = dY W (NN) and
** weight gradient dW = dY^T X (TN), for the 5.5M Llama of tools/bench/train_vs_torch.sh
** (2,048 tokens, dim 256, q|k|v 768, w1|w3 1,536, ffn 768, vocabulary 4,096) and GPT-2
** 124M at 4 x 64 tokens (dim 768, qkv 2,304, ffn 3,072, vocabulary 50,257); and one
** head's attention products (scores Q K^T, NT, and P V, NN) at 256 x 256 x 64.
**
** Beside them, the bf16 column: oneDNN's gemm_bf16bf16f32 on the operands rounded to
** bf16, f32 sums (what TETRA_BF16_GEMM=dot runs, on AVX512_BF16's dot-product
** instructions), checked against OpenBLAS's f32 product of the same rounded values, the
** emulation tetra runs by default; "bf16/f32" is its rate over the fastest f32 library's.
**
** Per shape the backends take turns, ROUNDS rounds; each round times repeats of the
** product until 0.2 s have passed, and a backend's figure is its best round (GFLOP/s).
** Each result is checked against OpenBLAS's (relative Frobenius difference) and against a
** second call of the same backend (bit for bit: the deterministic-results rule).
**
**   gemm_backends THREADS [ROUNDS]
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                               const float *, int, float, float *, int);
typedef int (*dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *,
                             int64_t, const float *, int64_t, float, float *, int64_t);

typedef int (*dnnl_bf16_fn)(char, char, int64_t, int64_t, int64_t, float, const uint16_t *,
                            int64_t, const uint16_t *, int64_t, float, float *, int64_t);

typedef struct {
  const char *name;
  cblas_sgemm_fn cblas;   /* OpenBLAS, BLIS */
  dnnl_sgemm_fn dnnl;     /* oneDNN */
  char version[96];
} backend;

typedef struct {
  const char *model, *what;
  int ta, tb;             /* 0: N, 1: T for A and B */
  int m, n, k;
} shape;

static const shape SHAPES[] = {
    {"llama", "q|k|v fwd", 0, 1, 2048, 768, 256},
    {"llama", "q|k|v dX", 0, 0, 2048, 256, 768},
    {"llama", "q|k|v dW", 1, 0, 768, 256, 2048},
    {"llama", "w1|w3 fwd", 0, 1, 2048, 1536, 256},
    {"llama", "w1|w3 dW", 1, 0, 1536, 256, 2048},
    {"llama", "w2 fwd", 0, 1, 2048, 256, 768},
    {"llama", "w2 dX", 0, 0, 2048, 768, 256},
    {"llama", "head fwd", 0, 1, 2048, 4096, 256},
    {"llama", "head dX", 0, 0, 2048, 256, 4096},
    {"llama", "head dW", 1, 0, 4096, 256, 2048},
    {"llama", "attn QK^T", 0, 1, 256, 256, 64},
    {"llama", "attn PV", 0, 0, 256, 64, 256},
    {"gpt2", "qkv fwd", 0, 1, 256, 2304, 768},
    {"gpt2", "qkv dW", 1, 0, 2304, 768, 256},
    {"gpt2", "fc fwd", 0, 1, 256, 3072, 768},
    {"gpt2", "proj dX", 0, 0, 256, 3072, 768},
    {"gpt2", "head fwd", 0, 1, 256, 50257, 768},
    {"gpt2", "head dW", 1, 0, 50257, 768, 256},
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* C = A' B' (alpha 1, beta 0) with the backend; A is m x k (k x m transposed), B k x n
** (n x k transposed), all contiguous. */
static void gemm(const backend *b, const shape *s, const float *A, const float *B, float *C) {
  int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
  if (b->cblas)
    b->cblas(ROW_MAJOR, s->ta ? TRANS : NO_TRANS, s->tb ? TRANS : NO_TRANS, s->m, s->n, s->k,
             1.0f, A, lda, B, ldb, 0.0f, C, s->n);
  else
    b->dnnl(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->m, s->n, s->k, 1.0f, A, lda, B, ldb,
            0.0f, C, s->n);
}

/* v rounded to bf16 (nearest, ties to even): its bits, and its value as a float. */
static uint16_t to_bf16(float v, float *widened) {
  uint32_t u;
  memcpy(&u, &v, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(widened, &u, 4);
  return (uint16_t)(u >> 16);
}

static void *open_lib(const char *const *paths) {
  for (int i = 0; paths[i]; i++) {
    void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
  }
  return NULL;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1, rounds = argc > 2 ? atoi(argv[2]) : 3;
  if (threads < 1 || rounds < 1) {
    fprintf(stderr, "usage: gemm_backends THREADS [ROUNDS]\n");
    return 2;
  }
  static const char *const openblas_paths[] = {"libopenblas.so.0", NULL};
  static const char *const blis_paths[] = {"/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4",
                                           "libblis.so.4", NULL};
  static const char *const dnnl_paths[] = {"libdnnl.so.3", "libdnnl.so.2", NULL};
  void *ho = open_lib(openblas_paths), *hb = open_lib(blis_paths), *hd = open_lib(dnnl_paths);
  if (!ho || !hb || !hd) {
    fprintf(stderr, "gemm_backends: cannot load %s (apt-get install libopenblas-dev "
            "libblis-dev libdnnl-dev)\n", !ho ? "OpenBLAS" : !hb ? "BLIS" : "oneDNN");
    return 1;
  }
  backend be[3] = {{"openblas", NULL, NULL, ""}, {"blis", NULL, NULL, ""},
                   {"onednn", NULL, NULL, ""}};
  be[0].cblas = (cblas_sgemm_fn)dlsym(ho, "cblas_sgemm");
  be[1].cblas = (cblas_sgemm_fn)dlsym(hb, "cblas_sgemm");
  be[2].dnnl = (dnnl_sgemm_fn)dlsym(hd, "dnnl_sgemm");
  dnnl_bf16_fn bf16 = (dnnl_bf16_fn)dlsym(hd, "dnnl_gemm_bf16bf16f32");
  void (*ob_threads)(int) = (void (*)(int))dlsym(ho, "openblas_set_num_threads");
  char *(*ob_core)(void) = (char *(*)(void))dlsym(ho, "openblas_get_corename");
  char *(*ob_config)(void) = (char *(*)(void))dlsym(ho, "openblas_get_config");
  void (*bli_threads)(long) = (void (*)(long))dlsym(hb, "bli_thread_set_num_threads");
  const char *(*bli_version)(void) = (const char *(*)(void))dlsym(hb, "bli_info_get_version_str");
  typedef struct { int major, minor, patch; const char *hash; unsigned cpu_runtime, gpu_runtime; } dv;
  const dv *(*dnnl_version)(void) = (const dv *(*)(void))dlsym(hd, "dnnl_version");
  if (!be[0].cblas || !be[1].cblas || !be[2].dnnl || !bf16 || !ob_threads || !bli_threads) {
    fprintf(stderr, "gemm_backends: a library lacks the symbols it should have\n");
    return 1;
  }
  /* Each library's own thread count, and OpenMP's for BLIS and oneDNN (both on libgomp). */
  ob_threads(threads);
  bli_threads(threads);
  omp_set_num_threads(threads);
  snprintf(be[0].version, sizeof be[0].version, "%s, core %s", ob_config ? ob_config() : "?",
           ob_core ? ob_core() : "?");
  snprintf(be[1].version, sizeof be[1].version, "BLIS %s (OpenMP)",
           bli_version ? bli_version() : "?");
  if (dnnl_version) {
    const dv *v = dnnl_version();
    snprintf(be[2].version, sizeof be[2].version, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
  }
  printf("# threads %d, rounds %d; best round's GFLOP/s per backend, each round at least 0.2 s\n",
         threads, rounds);
  for (int i = 0; i < 3; i++) printf("# %s: %s\n", be[i].name, be[i].version);
  printf("%-6s %-10s %2s %6s %6s %6s %9s %9s %9s  %-8s %-26s %9s %8s\n", "model", "product",
         "op", "M", "N", "K", "openblas", "blis", "onednn", "fastest",
         "max rel diff / repeat bits", "bf16 dot", "bf16/f32");
  int n_shapes = (int)(sizeof SHAPES / sizeof SHAPES[0]);
  double geo[3] = {0, 0, 0}, geo_bf16 = 0, geo_best = 0;
  int wins[3] = {0, 0, 0}, bad = 0;
  for (int si = 0; si < n_shapes; si++) {
    const shape *s = &SHAPES[si];
    size_t na = (size_t)s->m * s->k, nb = (size_t)s->k * s->n, nc = (size_t)s->m * s->n;
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C[3], *R = malloc(nc * 4);
    srand(1234 + si);
    for (size_t i = 0; i < na; i++) A[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < nb; i++) B[i] = (float)rand() / RAND_MAX - 0.5f;
    double best[3] = {0, 0, 0}, flop = 2.0 * s->m * s->n * (double)s->k;
    for (int b = 0; b < 3; b++) {
      C[b] = malloc(nc * 4);
      gemm(&be[b], s, A, B, C[b]);   /* warm-up, and the result checked below */
    }
    for (int r = 0; r < rounds; r++)
      for (int b = 0; b < 3; b++) {
        int reps = 0;
        double t0 = now(), t;
        do {
          gemm(&be[b], s, A, B, R);
          reps++;
        } while ((t = now() - t0) < 0.2);
        double g = flop * reps / t / 1e9;
        if (g > best[b]) best[b] = g;
      }
    /* Against OpenBLAS; and one more call of each backend (into R) equal bit for bit to
    ** its first. */
    double worst = 0;
    int same_bits = 1;
    for (int b = 0; b < 3; b++) {
      double num = 0, den = 0;
      for (size_t i = 0; i < nc; i++) {
        double d = (double)C[b][i] - C[0][i];
        num += d * d;
        den += (double)C[0][i] * C[0][i];
      }
      double rel = sqrt(num / (den > 0 ? den : 1));
      if (rel > worst) worst = rel;
      gemm(&be[b], s, A, B, R);
      if (memcmp(R, C[b], nc * 4) != 0) same_bits = 0;
    }
    int f = 0;
    for (int b = 1; b < 3; b++)
      if (best[b] > best[f]) f = b;
    wins[f]++;
    for (int b = 0; b < 3; b++) geo[b] += log(best[b]);

    /* bf16 dot products on the rounded operands, against OpenBLAS's f32 product of them */
    uint16_t *Ab = malloc(na * 2), *Bb = malloc(nb * 2);
    for (size_t i = 0; i < na; i++) Ab[i] = to_bf16(A[i], &A[i]);
    for (size_t i = 0; i < nb; i++) Bb[i] = to_bf16(B[i], &B[i]);
    const int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    const char ta = s->ta ? 'T' : 'N', tb = s->tb ? 'T' : 'N';
    gemm(&be[0], s, A, B, C[0]);
    bf16(ta, tb, s->m, s->n, s->k, 1.0f, Ab, lda, Bb, ldb, 0.0f, C[1], s->n);
    double best16 = 0;
    for (int r = 0; r < rounds; r++) {
      int reps = 0;
      double t0 = now(), t;
      do {
        bf16(ta, tb, s->m, s->n, s->k, 1.0f, Ab, lda, Bb, ldb, 0.0f, R, s->n);
        reps++;
      } while ((t = now() - t0) < 0.2);
      if (flop * reps / t / 1e9 > best16) best16 = flop * reps / t / 1e9;
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < nc; i++) {
      double d = (double)C[1][i] - C[0][i];
      num += d * d;
      den += (double)C[0][i] * C[0][i];
    }
    const double rel16 = sqrt(num / (den > 0 ? den : 1));
    const int same16 = memcmp(R, C[1], nc * 4) == 0;
    geo_bf16 += log(best16);
    geo_best += log(best[f]);
    free(Ab);
    free(Bb);

    char diff[48];
    snprintf(diff, sizeof diff, "%.1e / %s", worst, same_bits ? "same" : "DIFFER");
    printf("%-6s %-10s %c%c %6d %6d %6d %9.1f %9.1f %9.1f  %-8s %-26s %9.1f %7.2fx%s\n",
           s->model, s->what, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->m, s->n, s->k, best[0],
           best[1], best[2], be[f].name, diff, best16, best16 / best[f],
           rel16 > 1e-5 || !same16 ? "  bf16 DIFFERS" : "");
    if (worst > 1e-4 || !same_bits || rel16 > 1e-5 || !same16) bad = 1;
    for (int b = 0; b < 3; b++) free(C[b]);
    free(A);
    free(B);
    free(R);
  }
  printf("geometric mean GFLOP/s: openblas %.1f, blis %.1f, onednn %.1f; fastest on %d, %d, %d "
         "of %d shapes\n", exp(geo[0] / n_shapes), exp(geo[1] / n_shapes),
         exp(geo[2] / n_shapes), wins[0], wins[1], wins[2], n_shapes);
  printf("bf16 dot products (oneDNN): geometric mean %.1f GFLOP/s, %.2fx the fastest f32 "
         "library's\n", exp(geo_bf16 / n_shapes), exp((geo_bf16 - geo_best) / n_shapes));
  if (bad) printf("FAIL: a backend disagrees with OpenBLAS past 1e-4 (bf16: 1e-5 against the "
                  "emulation) or with itself\n");
  return bad;
}

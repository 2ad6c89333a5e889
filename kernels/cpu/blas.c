/*
** blas.c — the library the CPU matmul family runs its f32 products on (tt_blas_select):
** OpenBLAS, which the engine links, or BLIS or oneDNN, loaded when chosen with dlopen
** (RTLD_LOCAL: BLIS's own cblas_sgemm must not stand in for OpenBLAS's elsewhere).
** tools/bench/gemm_backends.sh measures the three on the engine's shapes; on the machines
** measured so far OpenBLAS was fastest overall, so it is the default. Attention's block
** products (attention.c) stay on OpenBLAS whatever is chosen: they run many small
** products inside the engine's own OpenMP loop, where BLIS and oneDNN measured at half
** OpenBLAS's rate.
**
** bf16 products (tt_bf16_gemm_select): "emulate", the default, multiplies f32 copies of
** the bf16-rounded operands on the library above; "dot" gives the bf16 operands themselves
** to oneDNN's gemm_bf16bf16f32 (f32 sums), which runs the CPU's bf16 dot-product
** instructions (AVX512_BF16's vdpbf16ps). Measured on an AVX512_BF16 Xeon without AMX,
** those retire at half the rate of f32 FMAs (tools/bench/gemm_backends.sh), so the
** emulation stays the default.
*/
#include "blas.h"
#include "kernel.h"
#include <cblas.h>
#include <dlfcn.h>
#include <stdint.h>
#include <omp.h>
#include <string.h>

typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                               const float *, int, float, float *, int);
typedef int (*dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *,
                             int64_t, const float *, int64_t, float, float *, int64_t);
typedef int (*dnnl_bf16_fn)(char, char, int64_t, int64_t, int64_t, float, const uint16_t *,
                            int64_t, const uint16_t *, int64_t, float, float *, int64_t);

static const char *g_name = "openblas";
static cblas_sgemm_fn g_cblas;        /* BLIS's; NULL: OpenBLAS's, linked */
static dnnl_sgemm_fn g_dnnl;          /* oneDNN's */
static void (*g_blis_threads)(long);  /* BLIS keeps a thread count of its own */
static int64_t g_calls[4];            /* products run: openblas, blis, onednn, bf16-dot */
static dnnl_bf16_fn g_bf16_dot;       /* oneDNN's bf16 GEMM when "dot" is chosen, else NULL */

static const char *const DNNL_PATHS[] = {"libdnnl.so.3", "libdnnl.so.2", NULL};

static void *open_first(const char *const *paths) {
  for (int i = 0; paths[i]; i++) {
    void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
  }
  return NULL;
}

int tt_blas_select(const char *name) {
  if (!name || !*name || !strcmp(name, "openblas")) {
    g_name = "openblas";
    g_cblas = NULL;
    g_dnnl = NULL;
    g_blis_threads = NULL;
    return 0;
  }
  if (!strcmp(name, "blis")) {
    static const char *const paths[] = {"libblis.so.4",
                                        "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4",
                                        "/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4",
                                        NULL};
    void *h = open_first(paths);
    TT_CHECK(h, "TETRA_BLAS=blis: BLIS is not installed (libblis.so.4; on Debian: apt-get "
                "install libblis4-openmp), or unset TETRA_BLAS for OpenBLAS");
    cblas_sgemm_fn f = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
    void (*threads)(long) = (void (*)(long))dlsym(h, "bli_thread_set_num_threads");
    TT_CHECK(f && threads, "TETRA_BLAS=blis: this libblis.so.4 has no cblas_sgemm");
    threads(omp_get_max_threads());
    g_name = "blis", g_cblas = f, g_dnnl = NULL, g_blis_threads = threads;
    return 0;
  }
  if (!strcmp(name, "onednn")) {
    void *h = open_first(DNNL_PATHS);
    TT_CHECK(h, "TETRA_BLAS=onednn: oneDNN is not installed (libdnnl.so.3 or .2; on Debian: "
                "apt-get install libdnnl2), or unset TETRA_BLAS for OpenBLAS");
    dnnl_sgemm_fn f = (dnnl_sgemm_fn)dlsym(h, "dnnl_sgemm");
    TT_CHECK(f, "TETRA_BLAS=onednn: this libdnnl has no dnnl_sgemm");
    g_name = "onednn", g_cblas = NULL, g_dnnl = f, g_blis_threads = NULL;
    return 0;
  }
  return tt_set_error("TETRA_BLAS=%s is not a library tetra knows: use openblas (the "
                      "default), blis or onednn", name);
}

const char *tt_blas_selected(void) { return g_name; }

int64_t tt_blas_calls(const char *name) {
  return !strcmp(name, "openblas") ? g_calls[0] : !strcmp(name, "blis") ? g_calls[1]
         : !strcmp(name, "onednn") ? g_calls[2] : !strcmp(name, "bf16-dot") ? g_calls[3] : -1;
}

int tt_bf16_gemm_select(const char *name, int cpu_has_bf16) {
  if (!name || !*name || !strcmp(name, "emulate")) {
    g_bf16_dot = NULL;
    return 0;
  }
  TT_CHECK(!strcmp(name, "dot"), "TETRA_BF16_GEMM=%s is not a choice tetra knows: use "
           "emulate (the default) or dot", name);
  TT_CHECK(cpu_has_bf16, "TETRA_BF16_GEMM=dot: this CPU has no bf16 dot-product "
           "instructions (cpuid: no AVX512_BF16), so oneDNN would only emulate them more "
           "slowly; unset TETRA_BF16_GEMM");
  void *h = open_first(DNNL_PATHS);
  TT_CHECK(h, "TETRA_BF16_GEMM=dot: oneDNN is not installed (libdnnl.so.3 or .2; on Debian: "
              "apt-get install libdnnl2), or unset TETRA_BF16_GEMM");
  dnnl_bf16_fn f = (dnnl_bf16_fn)dlsym(h, "dnnl_gemm_bf16bf16f32");
  TT_CHECK(f, "TETRA_BF16_GEMM=dot: this libdnnl has no dnnl_gemm_bf16bf16f32");
  g_bf16_dot = f;
  return 0;
}

const char *tt_bf16_gemm_selected(void) { return g_bf16_dot ? "dot" : "emulate"; }

int tt_bf16_gemm_dot(void) { return g_bf16_dot != NULL; }

void tt_blas_set_threads(int n) {
  if (g_blis_threads) g_blis_threads(n);   /* OpenBLAS and oneDNN: set by the caller */
}

int tt_blas_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  if (g_dnnl) {
    __atomic_add_fetch(&g_calls[2], 1, __ATOMIC_RELAXED);
    int st = g_dnnl(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                    beta, c, ldc);
    return st == 0 ? 0 : tt_set_error("matmul: oneDNN's sgemm failed (status %d)", st);
  }
  const int ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  if (g_cblas) {
    __atomic_add_fetch(&g_calls[1], 1, __ATOMIC_RELAXED);
    g_cblas(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return 0;
  }
  __atomic_add_fetch(&g_calls[0], 1, __ATOMIC_RELAXED);
  cblas_sgemm(CblasRowMajor, (enum CBLAS_TRANSPOSE)ta, (enum CBLAS_TRANSPOSE)tb, m, n, k, alpha,
              a, lda, b, ldb, beta, c, ldc);
  return 0;
}

int tt_blas_gemm_bf16(int trans_a, int trans_b, int m, int n, int k, float alpha,
                      const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta,
                      float *c, int ldc) {
  TT_CHECK(g_bf16_dot, "matmul: internal error: a bf16 product without TETRA_BF16_GEMM=dot");
  __atomic_add_fetch(&g_calls[3], 1, __ATOMIC_RELAXED);
  const int st = g_bf16_dot(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda,
                            b, ldb, beta, c, ldc);
  return st == 0 ? 0 : tt_set_error("matmul: oneDNN's bf16 GEMM failed (status %d)", st);
}

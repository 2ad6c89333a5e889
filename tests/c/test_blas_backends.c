/*
** test_blas_backends.c — the libraries the CPU matmul family may run on (tt_blas_select,
** kernels/cpu/blas.c): BLIS and oneDNN against OpenBLAS on the engine's kinds of product
** (NT forward, NN input gradient, TN weight gradient, a batched one with odd sizes), each
** within f32 rounding of OpenBLAS's result and of a float64 product, and equal to
** itself bit for bit on a second call (same library, same threads, same bits). Both are
** installed by tools/setup; without one the test fails under CI=true and is skipped
** otherwise. Unknown names are refused with the names that work.
*/
#include "tt_test.h"

typedef struct {
  int ta, tb;
  int64_t batch, m, n, k;
} product;

static const product PRODUCTS[] = {
    {0, 1, 1, 96, 80, 64},    /* Linear forward: x (M, K) w^T */
    {0, 0, 1, 96, 64, 80},    /* input gradient: dy (M, N) w (N, K) */
    {1, 0, 1, 80, 64, 96},    /* weight gradient: dy^T x */
    {0, 0, 3, 33, 17, 29},    /* batched, odd sizes */
};

/* a, b stored as the product reads them: a (batch, M, K) or (batch, K, M) when ta. */
static tt_tensor *run(const char *lib, const product *p, tt_tensor *a, tt_tensor *b) {
  cr_assert(tt_blas_select(lib) == 0, "%s", tt_last_error());
  cr_assert_str_eq(tt_blas_selected(), lib);
  tt_tensor *out = NULL;
  int64_t before = tt_blas_calls(lib);
  cr_assert(tt_matmul(a, b, NULL, p->ta, p->tb, &out) == 0, "%s: %s", lib, tt_last_error());
  /* The products ran on that library: one call per batch entry. */
  cr_assert_eq(tt_blas_calls(lib) - before, p->batch, "%s ran %lld of %lld products", lib,
               (long long)(tt_blas_calls(lib) - before), (long long)p->batch);
  cr_assert(tt_blas_select("openblas") == 0);
  return out;
}

static int available(const char *lib) {
  if (tt_blas_select(lib) == 0) return 1;
  const char *ci = getenv("CI");
  cr_assert(!(ci && !strcmp(ci, "true")), "CI=true and %s is missing: %s (tools/setup "
            "installs it)", lib, tt_last_error());
  return 0;
}

static void check_library(const char *lib) {
  if (!available(lib)) cr_skip_test("%s is not installed: %s", lib, tt_last_error());
  tt_blas_select("openblas");
  tt_set_num_threads(2);
  for (size_t i = 0; i < sizeof PRODUCTS / sizeof PRODUCTS[0]; i++) {
    const product *p = &PRODUCTS[i];
    int64_t as[3] = {p->batch, p->ta ? p->k : p->m, p->ta ? p->m : p->k};
    int64_t bs[3] = {p->batch, p->tb ? p->n : p->k, p->tb ? p->k : p->n};
    tt_tensor *a = tt_test_rand(as, 3, 11 + i), *b = tt_test_rand(bs, 3, 23 + i);
    tt_tensor *ref = run("openblas", p, a, b), *got = run(lib, p, a, b),
              *again = run(lib, p, a, b);
    const float *r = tt_tensor_data(ref), *g = tt_tensor_data(got);
    int64_t n = tt_tensor_numel(ref);
    cr_assert_eq(n, p->batch * p->m * p->n);
    cr_assert(memcmp(tt_tensor_data(again), g, (size_t)n * 4) == 0,
              "%s, product %zu: a second call differs", lib, i);
    const float *A = tt_tensor_data(a), *B = tt_tensor_data(b);
    for (int64_t q = 0; q < p->batch; q++)
      for (int64_t x = 0; x < p->m; x++)
        for (int64_t y = 0; y < p->n; y++) {
          double exact = 0, mag = 0;
          for (int64_t z = 0; z < p->k; z++) {
            double u = p->ta ? A[(q * p->k + z) * p->m + x] : A[(q * p->m + x) * p->k + z];
            double v = p->tb ? B[(q * p->n + y) * p->k + z] : B[(q * p->k + z) * p->n + y];
            exact += u * v;
            mag += fabs(u * v);
          }
          int64_t at = (q * p->m + x) * p->n + y;
          /* k roundings of terms at most mag: k * 2^-24 * mag bounds either library. */
          double tol = (double)p->k * 0x1p-24 * mag + 1e-30;
          cr_assert(fabs(g[at] - exact) <= tol, "%s, product %zu, (%lld, %lld, %lld): %.9g, "
                    "float64 %.9g", lib, i, (long long)q, (long long)x, (long long)y, g[at], exact);
          cr_assert(fabs(g[at] - r[at]) <= 2 * tol, "%s against openblas at %lld", lib,
                    (long long)at);
        }
    tt_tensor *all[] = {a, b, ref, got, again};
    for (int j = 0; j < 5; j++) tt_tensor_release(all[j]);
  }
}

Test(blas_backends, blis_matches_openblas) { check_library("blis"); }
Test(blas_backends, onednn_matches_openblas) { check_library("onednn"); }

Test(blas_backends, unknown_name_is_refused) {
  cr_assert(tt_blas_select("mkl") != 0);
  cr_assert(strstr(tt_last_error(), "openblas (the default), blis or onednn") != NULL, "%s",
            tt_last_error());
  cr_assert_str_eq(tt_blas_selected(), "openblas");
  cr_assert(tt_blas_select(NULL) == 0 && tt_blas_select("") == 0);
  cr_assert_str_eq(tt_blas_selected(), "openblas");
}

/*
** matmul.c — CPU kernels of the matmul family (see kernels/matmul.h): sgemm for the
** products (OpenBLAS, or the library tt_blas_select chose: kernels/cpu/blas.c), OpenMP
** loops for the bias.
**
** Batches run one sgemm after another: OpenBLAS already spreads each product over the
** threads set by tt_set_num_threads, and the engine folds batches into the m or k dim
** of a single call wherever the layout allows (a linear layer over (B, T, K) is one
** (B*T, K) product).
*/
#include "matmul.h"
#include "blas.h"
#include "kernel.h"
#include <limits.h>

static int fits_blasint(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* The checks and the empty product (k == 0: C = beta * C, and beta 0 must not read C, which
** may hold NaN) both element types share; 1 when the caller still has products to run. */
static int gemm_sizes_ok(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                         int64_t ldc, float beta, float *c, int64_t stride_c, int64_t batch,
                         int *run) {
  *run = 0;
  if (!fits_blasint(m) || !fits_blasint(n) || !fits_blasint(k) || !fits_blasint(lda) ||
      !fits_blasint(ldb) || !fits_blasint(ldc))
    return tt_set_error("matmul: GEMM of (%lld, %lld) x (%lld, %lld) exceeds the 32-bit sizes "
                        "of the BLAS interface", (long long)m, (long long)k, (long long)k,
                        (long long)n);
  if (m == 0 || n == 0) return 0;
  if (k == 0) {
    for (int64_t i = 0; i < batch; i++)
      for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n; j++) {
          float *x = c + i * stride_c + r * ldc + j;
          *x = beta == 0.0f ? 0.0f : beta * *x;
        }
    return 0;
  }
  *run = 1;
  return 0;
}

static int cpu_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, int64_t stride_a, const float *b,
                    int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc,
                    int64_t stride_c, int64_t batch) {
  int run = 0;
  TT_TRY(gemm_sizes_ok(m, n, k, lda, ldb, ldc, beta, c, stride_c, batch, &run));
  for (int64_t i = 0; run && i < batch; i++)
    TT_TRY(tt_blas_sgemm(trans_a, trans_b, (int)m, (int)n, (int)k, alpha, a + i * stride_a,
                         (int)lda, b + i * stride_b, (int)ldb, beta, c + i * stride_c,
                         (int)ldc));
  return 0;
}

/* bf16 operands (TETRA_BF16_GEMM=dot): oneDNN's bf16 GEMM, f32 sums (kernels/cpu/blas.c). */
static int cpu_gemm_bf16(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                         float alpha, const uint16_t *a, int64_t lda, int64_t stride_a,
                         const uint16_t *b, int64_t ldb, int64_t stride_b, float beta,
                         float *c, int64_t ldc, int64_t stride_c, int64_t batch) {
  int run = 0;
  TT_TRY(gemm_sizes_ok(m, n, k, lda, ldb, ldc, beta, c, stride_c, batch, &run));
  for (int64_t i = 0; run && i < batch; i++)
    TT_TRY(tt_blas_gemm_bf16(trans_a, trans_b, (int)m, (int)n, (int)k, alpha,
                             a + i * stride_a, (int)lda, b + i * stride_b, (int)ldb, beta,
                             c + i * stride_c, (int)ldc));
  return 0;
}

static int cpu_bias_fill(float *c, const float *bias, int64_t rows, int64_t n, int64_t ldc) {
#pragma omp parallel for if (rows * n > TT_PARALLEL_GRAIN) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    float *restrict dst = c + r * ldc;
    for (int64_t j = 0; j < n; j++) dst[j] = bias[j];
  }
  return 0;
}

/* Columns summed together by one task: a double accumulator each, on the stack. */
enum { BIAS_BLOCK = 64 };

static int cpu_bias_backward(float *gbias, const float *g, int64_t rows, int64_t n) {
  const int64_t nblocks = (n + BIAS_BLOCK - 1) / BIAS_BLOCK;
#pragma omp parallel for if (rows * n > TT_PARALLEL_GRAIN) schedule(static)
  for (int64_t blk = 0; blk < nblocks; blk++) {
    const int64_t j0 = blk * BIAS_BLOCK;
    const int64_t w = n - j0 < BIAS_BLOCK ? n - j0 : BIAS_BLOCK;
    double acc[BIAS_BLOCK];
    for (int64_t j = 0; j < w; j++) acc[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      const float *restrict row = g + r * n + j0;
      for (int64_t j = 0; j < w; j++) acc[j] += row[j];
    }
    for (int64_t j = 0; j < w; j++) gbias[j0 + j] = (float)acc[j];
  }
  return 0;
}

const tt_matmul_kernels tt_matmul_cpu = {
  .gemm = cpu_gemm,
  .gemm_bf16 = cpu_gemm_bf16,
  .bias_fill = cpu_bias_fill,
  .bias_backward = cpu_bias_backward,
};

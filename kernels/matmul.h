/*
** matmul.h — kernel table of the matmul family: a strided-batched GEMM, the bias
** broadcast that seeds the output, and the bias gradient (a column sum).
**
** Matrices are row-major with a leading dimension, as in cblas with CblasRowMajor:
** op(A) is (m, k), op(B) is (k, n), C is (m, n); op(X) = X, or X^T when trans_x.
** A transposed *view* of a stored matrix reaches the kernel as the stored matrix with
** the trans flag flipped, so no copy is made for it.
*/
#ifndef TT_KERNELS_MATMUL_H
#define TT_KERNELS_MATMUL_H
#include <stdint.h>

typedef struct tt_matmul_kernels {
  /* For each i < batch:
  **   C_i (m, n) = alpha * op(A_i) op(B_i) + beta * C_i
  ** with A_i = a + i * stride_a (stride 0 shares one matrix), B_i and C_i likewise.
  ** stride_c is never 0 when batch > 1. beta 0 ignores C's old contents (even NaN). */
  int (*gemm)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
              int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
              int64_t batch);
  /* c (rows, n), leading dim ldc: every row = bias (n). */
  int (*bias_fill)(float *c, const float *bias, int64_t rows, int64_t n, int64_t ldc);
  /* gbias (n) = sum over rows of g (rows, n), g contiguous. */
  int (*bias_backward)(float *gbias, const float *g, int64_t rows, int64_t n);
  /* gemm with bf16 A and B (raw bits), f32 sums and C. The CPU's runs only while
  ** TETRA_BF16_GEMM=dot is chosen; NULL on CUDA, whose bf16 GEMMs are an op of their own
  ** (engine/cuda/matmul_lowp.cu). */
  int (*gemm_bf16)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t *a, int64_t lda, int64_t stride_a, const uint16_t *b,
                   int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc,
                   int64_t stride_c, int64_t batch);
} tt_matmul_kernels;

extern const tt_matmul_kernels tt_matmul_cpu;
extern const tt_matmul_kernels tt_matmul_cuda __attribute__((weak));

#endif

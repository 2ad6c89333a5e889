/*
** blas.h — the library the CPU matmul family runs its f32 products on (kernels/cpu/blas.c).
** tt_blas_select and tt_blas_selected are public (tetra.h); the rest is the kernels'.
*/
#ifndef TT_KERNELS_BLAS_H
#define TT_KERNELS_BLAS_H

#include <stdint.h>

/* "openblas" (NULL or "" too), "blis" or "onednn": 0, or -1 with the error set. */
int tt_blas_select(const char *name);
const char *tt_blas_selected(void);
/* Products each library ("openblas", "blis", "onednn", and "bf16-dot" for oneDNN's bf16
** GEMM) has run in this process; -1 for another name. */
int64_t tt_blas_calls(const char *name);

/* The selected library's thread count follows tt_set_num_threads (BLIS keeps its own). */
void tt_blas_set_threads(int n);

/* Row-major C = alpha op(A) op(B) + beta C on the selected library; 0, or -1 with the
** error set. */
int tt_blas_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* How the CPU multiplies bf16 operands: "emulate" (NULL or "" too: f32 products of the
** rounded values) or "dot" (oneDNN's bf16 GEMM, refused unless cpu_has_bf16). 0, or -1
** with the error set. */
int tt_bf16_gemm_select(const char *name, int cpu_has_bf16);
const char *tt_bf16_gemm_selected(void);
/* 1 when "dot" is selected: the matmul family hands bf16 operands to tt_blas_gemm_bf16. */
int tt_bf16_gemm_dot(void);

/* Row-major C = alpha op(A) op(B) + beta C of bf16 A and B (raw bits), f32 sums and C, on
** oneDNN; only while "dot" is selected. 0, or -1 with the error set. */
int tt_blas_gemm_bf16(int trans_a, int trans_b, int m, int n, int k, float alpha,
                      const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta,
                      float *c, int ldc);

#endif

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
/* Products each library ("openblas", "blis", "onednn") has run in this process; -1 for
** another name. */
int64_t tt_blas_calls(const char *name);

/* The selected library's thread count follows tt_set_num_threads (BLIS keeps its own). */
void tt_blas_set_threads(int n);

/* Row-major C = alpha op(A) op(B) + beta C on the selected library; 0, or -1 with the
** error set. */
int tt_blas_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc);

#endif

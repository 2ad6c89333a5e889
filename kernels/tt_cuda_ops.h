/*
** tt_cuda_ops.h — device entry points of the precision code (engine/optim/amp.c, engine/ops/fp8.c)
** implemented in kernels/cuda/cast.cu. The engine declares them weak: in a build without
** CUDA they are NULL and never called, since no tensor lives on a GPU there.
** Pointers are device memory; every call runs on the current stream and returns 0 or -1
** with the message set.
*/
#ifndef TT_CUDA_OPS_H
#define TT_CUDA_OPS_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* data[i] *= inv_scale for n elements of dtype (f32, bf16, f16); *found_inf |= 1 when an
** element was inf or NaN. */
int tt_cuda_unscale_check(void *data, int dtype, int64_t n, float inv_scale,
                          int *found_inf);
/* The same with found_inf left on the device: *found_inf_dev (device memory) = 1 when an
** element was inf or NaN, untouched otherwise. No host wait. */
int tt_cuda_unscale_flag(void *data, int dtype, int64_t n, float inv_scale,
                         float *found_inf_dev);
/* The same with the inverse scale read from device memory (*inv_dev). */
int tt_cuda_unscale_flag_dev(void *data, int dtype, int64_t n, const float *inv_dev,
                             float *found_inf_dev);
/* out = fp8(x * scale) (out_dtype TT_E4M3/TT_E5M2), or with fake = 1 the f32 value of
** that fp8 divided by scale again. x is f32, bf16 or f16. *amax = max |x|. */
int tt_cuda_fp8_quantize(const void *x, int x_dtype, int64_t n, float scale, int fp8_dtype,
                         int fake, void *out, float *amax);
/* out (f32) = float(q) / scale. */
int tt_cuda_fp8_dequantize(const void *q, int fp8_dtype, int64_t n, float scale,
                           float *out);

/* Row-major C (m, n) = alpha op(A) op(B) + beta C [+ bias (n) on every row], batched with
** element strides (0 shares a matrix), through cuBLASLt with fp32 accumulation. Operand
** dtypes: f32 (tf32 when allow_tf32), bf16, f16, or fp8 (e4m3/e5m2, sm_89+, with a_scale /
** b_scale: device f32 scalars the products are multiplied by, i.e. 1 / quantisation
** scale). C: f32, bf16 or f16. fast_accum (fp8 only): cuBLASLt's fast accumulation
** (CUBLASLT_MATMUL_DESC_FAST_ACCUM), sums kept in reduced precision along k. */
typedef struct tt_cuda_gemm_args {
  int trans_a, trans_b;
  int64_t m, n, k;
  const void *a; int64_t lda, stride_a; int a_dtype;
  const void *b; int64_t ldb, stride_b; int b_dtype;
  void *c; int64_t ldc, stride_c; int c_dtype;
  int64_t batch;
  float alpha, beta;
  const void *bias;
  const float *a_scale, *b_scale;
  int allow_tf32;
  int fast_accum;
} tt_cuda_gemm_args;
int tt_cuda_lt_gemm(const tt_cuda_gemm_args *args);
/* The plans (descriptors and algorithm) tt_cuda_lt_gemm made on this host thread, and the
** GEMMs that found theirs made already (the same shapes, dtypes, transposes, alignments,
** bias and scales present or not). Either pointer may be NULL. */
void tt_cuda_gemm_plan_counts(int64_t *made, int64_t *reused);

#ifdef __cplusplus
}
#endif
#endif

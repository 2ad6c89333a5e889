/*
** cross_entropy.cuh — what the cross-entropy kernels (loss.cu) and the vocab-parallel ones
** (vocab_parallel.cu) share: reading a target, and the backward's rows.
*/
#ifndef TT_CROSS_ENTROPY_CUH
#define TT_CROSS_ENTROPY_CUH
#include "kernel_cuda.h"

__device__ __forceinline__ int64_t tt_load_target(const void *t, int i64, int64_t i) {
  return i64 ? ((const int64_t *)t)[i] : (int64_t)((const int32_t *)t)[i];
}

/* One block per row of `width` logits holding columns [start, start + width) of the
** vocabulary (the whole one: start 0, width V): d = dloss / count * (exp(x - lse) -
** one-hot(target)), zero rows for ignored targets; a target outside the band adds no
** one-hot. */
template <typename T>
__global__ void tt_ce_grad(T *dlogits, const float *dloss, const float *count, const T *logits,
                           const float *lse, const void *targets, int tgt_i64,
                           int64_t ignore_index, int64_t start, int64_t width) {
  int64_t n = blockIdx.x;
  int64_t t = tt_load_target(targets, tgt_i64, n);
  T *d = dlogits + n * width;
  if (t == ignore_index) {
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) tt_st(d, j, 0.0f);
    return;
  }
  const T *row = logits + n * width;
  float k = *dloss / *count, l = lse[n];
  int64_t c = t - start;   /* outside [0, width) when the target is outside the band */
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x)
    tt_st(d, j, k * (__expf(tt_ld(row, j) - l) - (j == c ? 1.0f : 0.0f)));
}
#endif

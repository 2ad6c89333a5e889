/*
** reduce.h — kernel table of the reduction family: sum / mean, max (with the index of
** the first maximum, for backward) and softmax.
**
** Every kernel sees its input as a contiguous (outer, r, inner) block and reduces (or
** normalises) over the middle dim r; the engine maps any dim list onto that form,
** through one permuted copy when the reduced dims are not adjacent.
*/
#ifndef TT_KERNELS_REDUCE_H
#define TT_KERNELS_REDUCE_H
#include <stdint.h>

typedef struct tt_reduce_kernels {
  /* out (outer, inner) = scale * sum over r of x (outer, r, inner). */
  int (*sum)(float *out, const float *x, int64_t outer, int64_t r, int64_t inner,
             float scale);
  /* gx (outer, r, inner) = scale * g (outer, inner), broadcast over r. */
  int (*sum_backward)(float *gx, const float *g, int64_t outer, int64_t r, int64_t inner,
                      float scale);
  /* out (outer, inner) = max over r of x (outer, r, inner); idx (outer, inner) = the
  ** first r holding it (a NaN counts as the maximum). r >= 1. */
  int (*max)(float *out, int64_t *idx, const float *x, int64_t outer, int64_t r,
             int64_t inner);
  /* gx (outer, r, inner) = g (outer, inner) at r = idx, zero elsewhere. */
  int (*max_backward)(float *gx, const float *g, const int64_t *idx, int64_t outer,
                      int64_t r, int64_t inner);
  /* y (outer, r, inner) = softmax over r of x. */
  int (*softmax)(float *y, const float *x, int64_t outer, int64_t r, int64_t inner);
  /* gx = y * (g - sum over r of g * y), all (outer, r, inner). */
  int (*softmax_backward)(float *gx, const float *g, const float *y, int64_t outer,
                          int64_t r, int64_t inner);
} tt_reduce_kernels;

extern const tt_reduce_kernels tt_reduce_cpu;
extern const tt_reduce_kernels tt_reduce_cuda __attribute__((weak));

#endif

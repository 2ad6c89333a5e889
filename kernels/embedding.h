/*
** embedding.h — kernel table of the embedding family (token lookup and its scatter-add
** backward) on raw contiguous buffers.
**
** ids hold n token ids, int32 (ids_i64 = 0) or int64 (ids_i64 = 1). Every entry returns 0,
** or -1 with tt_last_error() set.
*/
#ifndef TT_KERNELS_EMBEDDING_H
#define TT_KERNELS_EMBEDDING_H
#include <stdint.h>

typedef struct tt_embedding_kernels {
  /* out[i, :] = weight[ids[i], :], rounded to out_dtype (f32 or bf16). weight: (V, D)
  ** f32, ids: (n), out: (n, D). Fails naming the position when an id is outside [0, V). */
  int (*forward)(void *out, const float *weight, const void *ids, int ids_i64, int64_t n,
                 int64_t V, int64_t D, int out_dtype);
  /* dweight[ids[i], :] += dout[i, :] (dout in dout_dtype, f32 or bf16; the sums f32).
  ** dweight: (V, D) accumulated into (the caller zeroes it for a fresh gradient), dout:
  ** (n, D). Deterministic: each row of dweight receives its contributions in token order,
  ** whatever the thread count. ids are known valid (forward checked them). */
  int (*backward)(float *dweight, const void *dout, const void *ids, int ids_i64,
                  int64_t n, int64_t V, int64_t D, int dout_dtype);
} tt_embedding_kernels;

extern const tt_embedding_kernels tt_embedding_cpu;
extern const tt_embedding_kernels tt_embedding_cuda __attribute__((weak));

#endif

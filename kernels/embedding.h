/*
** embedding.h — kernel table of the embedding family (token lookup, its scatter-add
** backward and the touched rows of a gradient) on raw contiguous buffers.
**
** ids hold n token ids, int32 (ids_i64 = 0) or int64 (ids_i64 = 1). Every entry returns 0,
** or -1 with tt_last_error() set.
*/
#ifndef TT_KERNELS_EMBEDDING_H
#define TT_KERNELS_EMBEDDING_H
#include <stdint.h>

/* start: the id of the table's first row (0, or a vocabulary-parallel rank's first id):
** token i reads row ids[i] - start. */
typedef struct tt_embedding_kernels {
  /* out[i, :] = weight[ids[i] - start, :], rounded to out_dtype (f32 or bf16). weight:
  ** (V, D) f32, ids: (n), out: (n, D). An id outside [start, start + V): with `band`, a row
  ** of zeros (another rank's id); without, a failure naming the position. */
  int (*forward)(void *out, const float *weight, const void *ids, int ids_i64, int64_t n,
                 int64_t V, int64_t D, int out_dtype, int64_t start, int band);
  /* dweight[ids[i] - start, :] += dout[i, :] (dout in dout_dtype, f32 or bf16; the sums
  ** f32). dweight: (V, D) accumulated into (the caller zeroes it for a fresh gradient),
  ** dout: (n, D). Deterministic: each row of dweight receives its contributions in token
  ** order, whatever the thread count. Ids outside [start, start + V) add nothing. */
  int (*backward)(float *dweight, const void *dout, const void *ids, int ids_i64,
                  int64_t n, int64_t V, int64_t D, int dout_dtype, int64_t start);
  /* The rows of a table's gradient g (V, D) f32 that hold anything: bit v % 32 of
  ** mask[v / 32] set where row v has an element other than zero (NaN and inf count), the
  ** other bits clear; mask holds (V + 31) / 32 words on g's device, all written. A
  ** row-sparse reduction sends only those rows (engine/dist/reducer.c). */
  int (*row_mask)(uint32_t *mask, const float *g, int64_t V, int64_t D);
} tt_embedding_kernels;

extern const tt_embedding_kernels tt_embedding_cpu;
extern const tt_embedding_kernels tt_embedding_cuda __attribute__((weak));

#endif

/*
** loss.h — kernel table of the fused cross-entropy loss on raw contiguous buffers.
**
** logits: (N, V) in dtype, f32 or bf16 (the arithmetic f32); targets: (N) int32
** (tgt_i64 = 0) or int64. Rows whose target equals
** ignore_index take no part; the loss is the mean over the others. When every row is
** ignored the loss is 0 and the gradient is zero (not NaN). Every entry returns 0, or -1
** with tt_last_error() set.
*/
#ifndef TT_KERNELS_LOSS_H
#define TT_KERNELS_LOSS_H
#include <stdint.h>

typedef struct tt_loss_kernels {
  /* loss: one float, the mean over counted rows of logsumexp(logits[n]) - logits[n, t].
  ** row_stats: (2, N) workspace kept for the backward: per-row logsumexp, then per-row
  ** loss (0 for ignored rows). Fails naming the row when a target is outside [0, V) and
  ** is not ignore_index. */
  int (*ce_forward)(float *loss, float *row_stats, const void *logits, const void *targets,
                    int tgt_i64, int64_t ignore_index, int64_t N, int64_t V, int dtype);
  /* dlogits[n, j] = dloss / count * (softmax(logits[n])[j] - (j == t_n)), zero rows for
  ** ignored targets. The softmax is recomputed row by row from the saved logsumexp.
  ** dloss: one float (upstream gradient of the scalar loss). dlogits: (N, V) in dtype */
  int (*ce_backward)(void *dlogits, const float *dloss, const void *logits,
                     const float *row_stats, const void *targets, int tgt_i64,
                     int64_t ignore_index, int64_t N, int64_t V, int dtype);
} tt_loss_kernels;

extern const tt_loss_kernels tt_loss_cpu;
extern const tt_loss_kernels tt_loss_cuda __attribute__((weak));

/* CPU helpers shared with the vocab-parallel family (kernels/cpu/vocab_parallel.c).
** The sum of exp(x[j] - mx) over a row of `width`, in float blocks of 1024 columns added
** in float64 (so the sum does not depend on the thread count). */
double tt_ce_sum_exp(const float *x, float mx, int64_t width);
/* k scratch rows of `width` floats per thread for bf16 logits (*out, freed by the
** caller); NULL with no error for f32. */
int tt_ce_scratch(const char *op, int dtype, int64_t width, int k, int nthr, float **out);

/* The CPU backward's rows, shared with the vocab-parallel family (kernels/cpu/
** vocab_parallel.c), whose rows hold columns [start, start + width) of the vocabulary
** (the whole one: start 0, width V): dlogits[n, j] = scale * (exp(logits[n, j] - lse[n])
** - (start + j == t_n)), zero rows for ignored targets; a target outside the band adds
** no one-hot. */
int tt_ce_grad_rows(const char *op, void *dlogits, float scale, const void *logits,
                    const float *lse, const void *targets, int tgt_i64,
                    int64_t ignore_index, int64_t start, int64_t N, int64_t width, int dtype);

#endif

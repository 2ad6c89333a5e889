/*
** vocab_parallel.h — kernel table of the per-rank pieces of the vocab-parallel
** cross-entropy (engine/ops/vocab_parallel.c), on raw contiguous buffers.
**
** The logits are this rank's shard of the vocabulary: (N, Vl) in dtype, f32 or bf16 (the
** arithmetic f32), columns [vocab_start, vocab_start + Vl) of the full (N, V). targets:
** (N) global ids, int32 (tgt_i64 = 0) or int64. Rows whose target equals ignore_index
** take no part. The op runs the collectives between the entries, over the tensor-parallel
** group:
**   row_max       -> all-reduce MAX of row_max
**   row_partials  -> all-reduce SUM of partials
**   finish        (the loss and the per-row logsumexp, the same on every rank)
**   backward      (local: each rank the gradient of its own columns)
** Every entry returns 0, or -1 with tt_last_error() set.
*/
#ifndef TT_KERNELS_VOCAB_PARALLEL_H
#define TT_KERNELS_VOCAB_PARALLEL_H
#include <stdint.h>

typedef struct tt_vocab_parallel_kernels {
  /* row_max: (N) the maximum of each local row; 0 for ignored rows (on every rank, so the
  ** all-reduced value of an ignored row is 0 too). */
  int (*row_max)(float *row_max, const void *logits, const void *targets, int tgt_i64,
                 int64_t ignore_index, int64_t N, int64_t Vl, int dtype);
  /* partials: (3, N), given the group's row_max (N): the local sum of exp(x - row_max),
  ** the target's logit when this rank owns it (else 0), and 1 when this rank owns the
  ** target (else 0). Ignored rows: zeros. */
  int (*row_partials)(float *partials, const void *logits, const float *row_max,
                      const void *targets, int tgt_i64, int64_t ignore_index,
                      int64_t vocab_start, int64_t N, int64_t Vl, int dtype);
  /* From the group's row_max (N) and partials (3, N): lse (N) = row_max + log(sum of
  ** exp) (0 for ignored rows) and loss (one float) = the mean over counted rows of lse -
  ** target logit, 0 when every row is ignored. Fails naming the row when a counted
  ** target is not owned by exactly one rank (outside the group's vocabulary); with
  ** deferred checks on (CUDA) the failure is recorded for the step's one read instead. */
  int (*finish)(float *loss, float *lse, const float *row_max, const float *partials,
                const void *targets, int tgt_i64, int64_t ignore_index, int64_t vocab_start,
                int64_t N, int64_t Vl);
  /* dlogits (N, Vl) in dtype = dloss / count * (exp(x - lse) - [column is the target]),
  ** count the rows not ignored; zero rows for ignored targets. dloss: one float. */
  int (*backward)(void *dlogits, const float *dloss, const void *logits, const float *lse,
                  const void *targets, int tgt_i64, int64_t ignore_index, int64_t vocab_start,
                  int64_t N, int64_t Vl, int dtype);
} tt_vocab_parallel_kernels;

extern const tt_vocab_parallel_kernels tt_vocab_parallel_cpu;
extern const tt_vocab_parallel_kernels tt_vocab_parallel_cuda __attribute__((weak));

#endif

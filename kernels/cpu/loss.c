/*
** loss.c — CPU kernels of the fused cross-entropy.
**
** Forward, per row: max, then sum of exp(x - max) (vectorised exp, float partial sums
** per block of columns added in float64), logsumexp = max + log(sum). Rows run in
** parallel; the per-row losses land in a buffer and are summed in row order in float64,
** so the loss does not depend on the thread count. The backward recomputes the softmax of
** each row from its saved logsumexp while writing the gradient: no (N, V) probability
** tensor ever exists besides the gradient itself. bf16 logits are read a row at a time into
** f32 (one row per thread) and the gradient rounded to bf16 once.
*/
#include "loss.h"
#include "activation.h"   /* tt_vexpf */
#include "kernel.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>

enum { SUM_BLOCK = 1024 };   /* columns per float partial sum */

/* Counts the rows that take part; fails on the first target outside [0, V). */
static int count_targets(const void *targets, int tgt_i64, int64_t ignore_index, int64_t N,
                         int64_t V, int64_t *count) {
  int dtype = tgt_i64 ? TT_ELEM_I64 : TT_ELEM_I32;
  int64_t c = 0;
  for (int64_t n = 0; n < N; n++) {
    int64_t t = tt_index_at(targets, dtype, n);
    if (t == ignore_index) continue;
    if (t < 0 || t >= V)
      return tt_set_error("cross_entropy: target %lld at row %lld is outside [0, %lld) "
                          "and is not ignore_index %lld", (long long)t, (long long)n,
                          (long long)V, (long long)ignore_index);
    c++;
  }
  *count = c;
  return 0;
}

double tt_ce_sum_exp(const float *x, float mx, int64_t width) {
  double sum = 0.0;
  for (int64_t j0 = 0; j0 < width; j0 += SUM_BLOCK) {
    int64_t j1 = j0 + SUM_BLOCK < width ? j0 + SUM_BLOCK : width;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = j0; j < j1; j++) s += tt_vexpf(x[j] - mx);
    sum += s;
  }
  return sum;
}

int tt_ce_scratch(const char *op, int dtype, int64_t width, int k, int nthr, float **out) {
  *out = dtype == TT_ELEM_BF16 ? tt_scratch_rows(op, width, k, nthr) : NULL;
  return dtype == TT_ELEM_BF16 && !*out ? -1 : 0;
}

/* logsumexp of one row x: (V) */
static float row_logsumexp(const float *x, int64_t V) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
  if (isinf(mx)) return mx;   /* all -inf (or +inf present): exp(x - mx) would give NaN */
  return mx + (float)log(tt_ce_sum_exp(x, mx, V));
}

static int check_dtype(int dtype) {
  TT_CHECK(dtype == TT_ELEM_F32 || dtype == TT_ELEM_BF16,
           "cross_entropy: logits are %s; expected f32 or bf16", tt_dtype_name(dtype));
  return 0;
}

/* logits: (N, V) in dtype, targets: (N), row_stats: (2, N), loss: (1) */
static int ce_forward(float *loss, float *row_stats, const void *logits,
                      const void *targets, int tgt_i64, int64_t ignore_index, int64_t N,
                      int64_t V, int dtype) {
  TT_TRY(check_dtype(dtype));
  int64_t count = 0;
  TT_TRY(count_targets(targets, tgt_i64, ignore_index, N, V, &count));
  const int tdtype = tgt_i64 ? TT_ELEM_I64 : TT_ELEM_I32, nthr = omp_get_max_threads();
  float *lse = row_stats, *row_loss = row_stats + N, *scratch = NULL;
  TT_TRY(tt_ce_scratch("cross_entropy", dtype, V, 1, nthr, &scratch));
#pragma omp parallel num_threads(nthr) if (N * V > TT_PARALLEL_GRAIN)
  {
    float *mine = scratch ? scratch + (size_t)omp_get_thread_num() * V : NULL;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
      int64_t t = tt_index_at(targets, tdtype, n);
      if (t == ignore_index) {
        lse[n] = 0.0f;
        row_loss[n] = 0.0f;
        continue;
      }
      const float *x = tt_row_in(logits, dtype, n * V, V, mine);
      lse[n] = row_logsumexp(x, V);
      row_loss[n] = lse[n] - x[t];
    }
  }
  free(scratch);
  double total = 0.0;
  for (int64_t n = 0; n < N; n++) total += row_loss[n];
  *loss = count > 0 ? (float)(total / (double)count) : 0.0f;
  return 0;
}

int tt_ce_grad_rows(const char *op, void *dlogits, float scale, const void *logits,
                    const float *lse, const void *targets, int tgt_i64,
                    int64_t ignore_index, int64_t start, int64_t N, int64_t width, int dtype) {
  const int tdtype = tgt_i64 ? TT_ELEM_I64 : TT_ELEM_I32, nthr = omp_get_max_threads();
  float *scratch = NULL;
  TT_TRY(tt_ce_scratch(op, dtype, width, 2, nthr, &scratch));
#pragma omp parallel num_threads(nthr) if (N * width > TT_PARALLEL_GRAIN)
  {
    float *mine = scratch ? scratch + (size_t)omp_get_thread_num() * 2 * width : NULL;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
      int64_t t = tt_index_at(targets, tdtype, n);
      float *d = tt_row_out(dlogits, dtype, n * width, mine ? mine + width : NULL);
      if (t == ignore_index) {
        for (int64_t j = 0; j < width; j++) d[j] = 0.0f;
      } else {
        const float *x = tt_row_in(logits, dtype, n * width, width, mine);
        float l = lse[n];
#pragma omp simd
        for (int64_t j = 0; j < width; j++) d[j] = scale * tt_vexpf(x[j] - l);
        if (t >= start && t < start + width) d[t - start] -= scale;
      }
      tt_row_done(dlogits, dtype, n * width, width, d);
    }
  }
  free(scratch);
  return 0;
}

/* dlogits, logits: (N, V) in dtype, row_stats: (2, N), targets: (N), dloss: (1) */
static int ce_backward(void *dlogits, const float *dloss, const void *logits,
                       const float *row_stats, const void *targets, int tgt_i64,
                       int64_t ignore_index, int64_t N, int64_t V, int dtype) {
  TT_TRY(check_dtype(dtype));
  int64_t count = 0;
  TT_TRY(count_targets(targets, tgt_i64, ignore_index, N, V, &count));
  float scale = count > 0 ? (float)((double)*dloss / (double)count) : 0.0f;
  return tt_ce_grad_rows("cross_entropy", dlogits, scale, logits, row_stats, targets, tgt_i64,
                         ignore_index, 0, N, V, dtype);
}

const tt_loss_kernels tt_loss_cpu = {
  .ce_forward = ce_forward,
  .ce_backward = ce_backward,
};

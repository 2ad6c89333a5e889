/*
** vocab_parallel.c — CPU kernels of the vocab-parallel cross-entropy's per-rank pieces
** (kernels/vocab_parallel.h).
**
** The exp and the blocked float sums are those of the single-process cross-entropy
** (kernels/cpu/loss.c: float partial sums per block of columns added in float64), so a
** split run follows the single-process loss to fp32 rounding. Rows run in parallel; the
** loss is summed in row order in float64, so it does not depend on the thread count. bf16
** logits are read a row at a time into f32 (one scratch row per thread) and the gradient
** rounded to bf16 once.
*/
#include "vocab_parallel.h"
#include "loss.h"   /* tt_ce_sum_exp, tt_ce_scratch, tt_ce_grad_rows: shared with the CE */
#include "kernel.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>


static const char OP[] = "vocab_parallel_cross_entropy";

/* The local column of global id t, or -1 when this rank does not own it. */
static int64_t local_column(int64_t t, int64_t start, int64_t vl) {
  return t >= start && t < start + vl ? t - start : -1;
}

static int check_dtype(int dtype) {
  TT_CHECK(dtype == TT_ELEM_F32 || dtype == TT_ELEM_BF16,
           "%s: logits are %s; expected f32 or bf16", OP, tt_dtype_name(dtype));
  return 0;
}

/* logits: (N, Vl), targets: (N) -> mx: (N) */
static int row_max(float *mx, const void *logits, const void *targets, int tgt_i64,
                   int64_t ignore_index, int64_t N, int64_t vl, int dtype) {
  TT_TRY(check_dtype(dtype));
  const int tdtype = tgt_i64 ? TT_ELEM_I64 : TT_ELEM_I32, nthr = omp_get_max_threads();
  float *scratch = NULL;
  TT_TRY(tt_ce_scratch(OP, dtype, vl, 1, nthr, &scratch));
#pragma omp parallel num_threads(nthr) if (N * vl > TT_PARALLEL_GRAIN)
  {
    float *mine = scratch ? scratch + (size_t)omp_get_thread_num() * vl : NULL;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
      if (tt_index_at(targets, tdtype, n) == ignore_index) {
        mx[n] = 0.0f;
        continue;
      }
      const float *xr = tt_row_in(logits, dtype, n * vl, vl, mine);
      float m = -INFINITY;
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < vl; j++) m = xr[j] > m ? xr[j] : m;
      mx[n] = m;
    }
  }
  free(scratch);
  return 0;
}

/* logits: (N, Vl), mx: (N), targets: (N) -> red: (3, N) sum of exp, target logit, owned */
static int row_partials(float *red, const void *logits, const float *mx, const void *targets,
                        int tgt_i64, int64_t ignore_index, int64_t start, int64_t N,
                        int64_t vl, int dtype) {
  TT_TRY(check_dtype(dtype));
  const int tdtype = tgt_i64 ? TT_ELEM_I64 : TT_ELEM_I32, nthr = omp_get_max_threads();
  float *scratch = NULL;
  TT_TRY(tt_ce_scratch(OP, dtype, vl, 1, nthr, &scratch));
#pragma omp parallel num_threads(nthr) if (N * vl > TT_PARALLEL_GRAIN)
  {
    float *mine = scratch ? scratch + (size_t)omp_get_thread_num() * vl : NULL;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
      int64_t t = tt_index_at(targets, tdtype, n);
      red[n] = red[N + n] = red[2 * N + n] = 0.0f;
      if (t == ignore_index) continue;
      const float *xr = tt_row_in(logits, dtype, n * vl, vl, mine);
      red[n] = (float)tt_ce_sum_exp(xr, mx[n], vl);
      int64_t c = local_column(t, start, vl);
      if (c >= 0) {
        red[N + n] = xr[c];
        red[2 * N + n] = 1.0f;
      }
    }
  }
  free(scratch);
  return 0;
}

/* mx: (N), red: (3, N), targets: (N) -> lse: (N), loss: (1) */
static int finish(float *loss, float *lse, const float *mx, const float *red,
                  const void *targets, int tgt_i64, int64_t ignore_index, int64_t start,
                  int64_t N, int64_t vl) {
  (void)start;
  (void)vl;
  const int tdtype = tgt_i64 ? TT_ELEM_I64 : TT_ELEM_I32;
  double total = 0.0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; n++) {
    int64_t t = tt_index_at(targets, tdtype, n);
    lse[n] = 0.0f;
    if (t == ignore_index) continue;
    if (t < 0)
      return tt_set_error("%s: target %lld at row %lld is negative and is not ignore_index "
                          "%lld", OP, (long long)t, (long long)n, (long long)ignore_index);
    if (red[2 * N + n] != 1.0f)
      return tt_set_error("%s: target %lld at row %lld is outside the vocabulary of the "
                          "group (owned by %g ranks)", OP, (long long)t, (long long)n,
                          (double)red[2 * N + n]);
    lse[n] = mx[n] + (float)log((double)red[n]);
    total += (double)(lse[n] - red[N + n]);
    count++;
  }
  *loss = count > 0 ? (float)(total / (double)count) : 0.0f;
  return 0;
}

/* dlogits, logits: (N, Vl) in dtype, lse: (N), targets: (N), dloss: (1) */
static int backward(void *dlogits, const float *dloss, const void *logits, const float *lse,
                    const void *targets, int tgt_i64, int64_t ignore_index, int64_t start,
                    int64_t N, int64_t vl, int dtype) {
  TT_TRY(check_dtype(dtype));
  const int tdtype = tgt_i64 ? TT_ELEM_I64 : TT_ELEM_I32;
  int64_t count = 0;
  for (int64_t n = 0; n < N; n++) count += tt_index_at(targets, tdtype, n) != ignore_index;
  float scale = count > 0 ? (float)((double)*dloss / (double)count) : 0.0f;
  return tt_ce_grad_rows(OP, dlogits, scale, logits, lse, targets, tgt_i64, ignore_index,
                         start, N, vl, dtype);
}

const tt_vocab_parallel_kernels tt_vocab_parallel_cpu = {
  .row_max = row_max,
  .row_partials = row_partials,
  .finish = finish,
  .backward = backward,
};

/*
** ops_vocab_parallel.c — tt_vocab_parallel_cross_entropy: the cross-entropy of logits
** whose vocabulary is split over a tensor-parallel group, without gathering them.
**
** Forward, per row n of this rank's (N, Vl) logits:
**   max_n     = all-reduce max of the local row max
**   sumexp_n  = all-reduce sum of sum_j exp(x_nj - max_n)
**   target_n  = all-reduce sum of x_n,t-start (0 on ranks that do not own t)
**   owned_n   = all-reduce sum of [rank owns t]   (must be 1: catches bad targets)
**   loss      = mean over rows with t != ignore_index of max_n + log(sumexp_n) - target_n
** The last three travel in one (3, N) all-reduce. The exp and the blocked float sums are
** those of the single-process tt_cross_entropy (kernels/cpu/loss.c), so a split run
** follows the single-process loss to fp32 rounding. Backward (local, no collective):
**   dx_nj = dloss / count * (exp(x_nj - lse_n) - [j == t_n - start]).
*/
#include "tetra_vocab_parallel.h"
#include "core/tt_internal.h"
#include "activation.h"   /* tt_vexpf */
#include <math.h>

enum { SUM_BLOCK = 1024 };   /* columns per float partial sum, as in kernels/cpu/loss.c */

static const char OP[] = "vocab_parallel_cross_entropy";

/* The local column of global id t, or -1 when this rank does not own it. */
static int64_t local_column(int64_t t, int64_t start, int64_t vl) {
  return t >= start && t < start + vl ? t - start : -1;
}

/* saved: [0] logits (N, Vl) contiguous, [1] targets (N), [2] lse (N); i[0] ignore_index,
** i[1] vocab_start, i[2] count of rows that take part. */
static int vp_ce_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *logits = node->inputs[0];
  if (!tt_needs_grad(logits)) return 0;
  tt_tensor *lc = node->saved[0], *tc = node->saved[1], *lse = node->saved[2];
  int64_t ignore = node->i[0], start = node->i[1], count = node->i[2];
  int64_t vl = lc->shape[lc->ndim - 1], N = tt_tensor_numel(tc);
  tt_tensor *g = NULL, *dl = NULL;
  int rc = -1;
  if (tt_contiguous_nograd(grad_out, &g) != 0 || tt_empty_like(lc, &dl) != 0) goto done;
  {
    const float *x = tt_tensor_data(lc), *l = tt_tensor_data(lse);
    const void *tg = tt_tensor_data(tc);
    float *dx = tt_tensor_data(dl);
    float scale = count > 0 ? (float)((double)*(const float *)tt_tensor_data(g) /
                                      (double)count) : 0.0f;
#pragma omp parallel for schedule(static) if (N * vl > TT_PARALLEL_GRAIN)
    for (int64_t n = 0; n < N; n++) {
      int64_t t = tt_index_at(tg, tc->dtype, n);
      float *d = dx + n * vl;
      if (t == ignore) {
        for (int64_t j = 0; j < vl; j++) d[j] = 0.0f;
        continue;
      }
      const float *xr = x + n * vl;
      float ln = l[n];
#pragma omp simd
      for (int64_t j = 0; j < vl; j++) d[j] = scale * tt_vexpf(xr[j] - ln);
      int64_t c = local_column(t, start, vl);
      if (c >= 0) d[c] -= scale;
    }
  }
  rc = tt_accumulate_grad(logits, dl);
done:
  tt_tensor_release(g);
  tt_tensor_release(dl);
  return rc;
}

/* Local row maxima into mx (N); rows that do not take part get 0 on every rank. */
static void row_max(float *mx, const float *x, const void *tg, int dtype, int64_t ignore,
                    int64_t N, int64_t vl) {
#pragma omp parallel for schedule(static) if (N * vl > TT_PARALLEL_GRAIN)
  for (int64_t n = 0; n < N; n++) {
    if (tt_index_at(tg, dtype, n) == ignore) {
      mx[n] = 0.0f;
      continue;
    }
    const float *xr = x + n * vl;
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < vl; j++) m = xr[j] > m ? xr[j] : m;
    mx[n] = m;
  }
}

/* red: (3, N) = local sum of exp(x - mx), local target logit, owned flag. */
static void row_partials(float *red, const float *x, const float *mx, const void *tg,
                         int dtype, int64_t ignore, int64_t start, int64_t N, int64_t vl) {
#pragma omp parallel for schedule(static) if (N * vl > TT_PARALLEL_GRAIN)
  for (int64_t n = 0; n < N; n++) {
    int64_t t = tt_index_at(tg, dtype, n);
    red[n] = red[N + n] = red[2 * N + n] = 0.0f;
    if (t == ignore) continue;
    const float *xr = x + n * vl;
    double sum = 0.0;
    for (int64_t j0 = 0; j0 < vl; j0 += SUM_BLOCK) {
      int64_t j1 = j0 + SUM_BLOCK < vl ? j0 + SUM_BLOCK : vl;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t j = j0; j < j1; j++) s += tt_vexpf(xr[j] - mx[n]);
      sum += s;
    }
    red[n] = (float)sum;
    int64_t c = local_column(t, start, vl);
    if (c >= 0) {
      red[N + n] = xr[c];
      red[2 * N + n] = 1.0f;
    }
  }
}

static int check_args(tt_comm *group, tt_tensor *logits, tt_tensor *targets,
                      int64_t vocab_start, tt_tensor **out) {
  char a[96], b[96];
  TT_CHECK(group && logits && targets && out,
           "%s: group, logits, targets and out must not be NULL", OP);
  TT_TRY(tt_check_dtype(OP, "logits", logits, TT_F32));
  TT_TRY(tt_check_index(OP, "targets", targets));
  TT_CHECK(logits->device == TT_CPU && targets->device == TT_CPU,
           "%s: CPU tensors only (logits on device %d, targets on device %d)", OP,
           logits->device, targets->device);
  TT_CHECK(vocab_start >= 0, "%s: vocab_start %lld must be >= 0", OP,
           (long long)vocab_start);
  int ok = logits->ndim >= 1 && logits->shape[logits->ndim - 1] >= 1 &&
           targets->ndim == logits->ndim - 1;
  for (int d = 0; ok && d < targets->ndim; d++) ok = targets->shape[d] == logits->shape[d];
  if (!ok)
    return tt_set_error("%s: logits %s must be (..., Vl) with Vl > 0 and targets %s must be "
                        "its leading dims (...)", OP, tt_tensor_describe(logits, a, sizeof a),
                        tt_tensor_describe(targets, b, sizeof b));
  return 0;
}

int tt_vocab_parallel_cross_entropy(tt_comm *group, tt_tensor *logits, tt_tensor *targets,
                                    int64_t vocab_start, int64_t ignore_index,
                                    tt_tensor **out) {
  TT_TRY(check_args(group, logits, targets, vocab_start, out));
  int64_t vl = logits->shape[logits->ndim - 1], N = tt_tensor_numel(targets);
  int64_t n1[1] = {N}, n3[2] = {3, N};
  tt_tensor *lc = NULL, *tc = NULL, *mx = NULL, *red = NULL, *lse = NULL, *loss = NULL;
  int64_t count = 0;
  if (tt_contiguous_nograd(logits, &lc) != 0 || tt_contiguous_nograd(targets, &tc) != 0 ||
      tt_tensor_empty(n1, 1, TT_F32, TT_CPU, &mx) != 0 ||
      tt_tensor_empty(n3, 2, TT_F32, TT_CPU, &red) != 0 ||
      tt_tensor_empty(n1, 1, TT_F32, TT_CPU, &lse) != 0 ||
      tt_tensor_empty(NULL, 0, TT_F32, TT_CPU, &loss) != 0)
    goto fail;
  const float *x = tt_tensor_data(lc);
  const void *tg = tt_tensor_data(tc);
  float *m = tt_tensor_data(mx), *r = tt_tensor_data(red), *l = tt_tensor_data(lse);
  for (int64_t n = 0; n < N; n++) {
    int64_t t = tt_index_at(tg, tc->dtype, n);
    if (t != ignore_index && t < 0) {
      tt_set_error("%s: target %lld at row %lld is negative and is not ignore_index %lld",
                   OP, (long long)t, (long long)n, (long long)ignore_index);
      goto fail;
    }
  }
  row_max(m, x, tg, tc->dtype, ignore_index, N, vl);
  if (tt_comm_all_reduce(group, mx, TT_REDUCE_MAX) != 0) goto fail;
  row_partials(r, x, m, tg, tc->dtype, ignore_index, vocab_start, N, vl);
  if (tt_comm_all_reduce(group, red, TT_REDUCE_SUM) != 0) goto fail;
  double total = 0.0;
  for (int64_t n = 0; n < N; n++) {
    int64_t t = tt_index_at(tg, tc->dtype, n);
    l[n] = 0.0f;
    if (t == ignore_index) continue;
    if (r[2 * N + n] != 1.0f) {
      tt_set_error("%s: target %lld at row %lld is outside the vocabulary of the group "
                   "(owned by %g ranks)", OP, (long long)t, (long long)n,
                   (double)r[2 * N + n]);
      goto fail;
    }
    l[n] = m[n] + (float)log((double)r[n]);
    total += (double)(l[n] - r[N + n]);
    count++;
  }
  *(float *)tt_tensor_data(loss) = count > 0 ? (float)(total / (double)count) : 0.0f;
  tt_tensor *ins[2] = {logits, targets};
  if (tt_should_record(ins, 2)) {
    tt_node *node = tt_record(OP, vp_ce_backward, loss, ins, 2);
    if (!node) goto fail;
    node->i[0] = ignore_index;
    node->i[1] = vocab_start;
    node->i[2] = count;
    tt_node_save(node, lc);
    tt_node_save(node, tc);
    tt_node_save(node, lse);
  }
  tt_tensor_release(lc);
  tt_tensor_release(tc);
  tt_tensor_release(mx);
  tt_tensor_release(red);
  tt_tensor_release(lse);
  *out = loss;
  return 0;
fail:
  tt_tensor_release(lc);
  tt_tensor_release(tc);
  tt_tensor_release(mx);
  tt_tensor_release(red);
  tt_tensor_release(lse);
  tt_tensor_release(loss);
  return -1;
}

/*
** ops_vocab_parallel.c — tt_vocab_parallel_cross_entropy: the cross-entropy of logits
** whose vocabulary is split over a tensor-parallel group, without gathering them.
**
** Forward, per row n of this rank's (N, Vl) logits (f32 or bf16, the arithmetic f32):
**   max_n     = all-reduce max of the local row max
**   sumexp_n  = all-reduce sum of sum_j exp(x_nj - max_n)
**   target_n  = all-reduce sum of x_n,t-start (0 on ranks that do not own t)
**   owned_n   = all-reduce sum of [rank owns t]   (must be 1: catches bad targets)
**   loss      = mean over rows with t != ignore_index of max_n + log(sumexp_n) - target_n
** The last three travel in one (3, N) all-reduce. Backward (local, no collective):
**   dx_nj = dloss / count * (exp(x_nj - lse_n) - [j == t_n - start]).
** The per-rank pieces are a kernel family (kernels/vocab_parallel.h, CPU and CUDA twins);
** the collectives stay here. Every intermediate lives on the logits' device.
*/
#include "tetra_vocab_parallel.h"
#include "core/tt_internal.h"
#include "vocab_parallel.h"

static const char OP[] = "vocab_parallel_cross_entropy";

/* saved: [0] logits (N, Vl) contiguous, [1] targets (N), [2] lse (N); i[0] ignore_index,
** i[1] vocab_start. */
static int vp_ce_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *logits = node->inputs[0];
  if (!tt_needs_grad(logits)) return 0;
  tt_tensor *lc = node->saved[0], *tc = node->saved[1], *lse = node->saved[2];
  const tt_vocab_parallel_kernels *k = TT_KERNELS(tt_vocab_parallel, lc->device);
  if (!k || !k->backward) return tt_no_kernel(OP, lc->device);
  int64_t vl = lc->shape[lc->ndim - 1], N = tt_tensor_numel(tc);
  tt_tensor *g = NULL, *dl = NULL;
  int rc = -1;
  if (tt_contiguous_nograd(grad_out, &g) != 0 || tt_empty_like(lc, &dl) != 0) goto done;
  if (k->backward(tt_tensor_data(dl), tt_tensor_data(g), tt_tensor_data(lc),
                  tt_tensor_data(lse), tt_tensor_data(tc), tc->dtype == TT_I64, node->i[0],
                  node->i[1], N, vl, lc->dtype) != 0)
    goto done;
  rc = tt_accumulate_grad(logits, dl);
done:
  tt_tensor_release(g);
  tt_tensor_release(dl);
  return rc;
}

static int check_args(tt_comm *group, tt_tensor *logits, tt_tensor *targets,
                      int64_t vocab_start, tt_tensor **out) {
  char a[96], b[96];
  TT_CHECK(group && logits && targets && out,
           "%s: group, logits, targets and out must not be NULL", OP);
  TT_CHECK(logits->dtype == TT_F32 || logits->dtype == TT_BF16,
           "%s: logits are %s; expected f32 or bf16", OP, tt_dtype_name(logits->dtype));
  TT_TRY(tt_check_index(OP, "targets", targets));
  tt_tensor *ins[2] = {logits, targets};
  TT_TRY(tt_check_same_device(OP, ins, 2));
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
  const tt_vocab_parallel_kernels *k = TT_KERNELS(tt_vocab_parallel, logits->device);
  if (!k || !k->row_max) return tt_no_kernel(OP, logits->device);
  int64_t vl = logits->shape[logits->ndim - 1], N = tt_tensor_numel(targets);
  int64_t n1[1] = {N}, n3[2] = {3, N};
  int dev = logits->device;
  tt_tensor *lc = NULL, *tc = NULL, *mx = NULL, *red = NULL, *lse = NULL, *loss = NULL;
  if (tt_contiguous_nograd(logits, &lc) != 0 || tt_contiguous_nograd(targets, &tc) != 0 ||
      tt_tensor_empty(n1, 1, TT_F32, dev, &mx) != 0 ||
      tt_tensor_empty(n3, 2, TT_F32, dev, &red) != 0 ||
      tt_tensor_empty(n1, 1, TT_F32, dev, &lse) != 0 ||
      tt_tensor_empty(NULL, 0, TT_F32, dev, &loss) != 0)
    goto fail;
  const void *x = tt_tensor_data(lc), *tg = tt_tensor_data(tc);
  int i64 = tc->dtype == TT_I64;
  float *m = tt_tensor_data(mx), *r = tt_tensor_data(red);
  int alone = tt_comm_size(group) == 1;   /* a group of one needs no collective (nor NCCL) */
  if (k->row_max(m, x, tg, i64, ignore_index, N, vl, lc->dtype) != 0 ||
      (!alone && tt_comm_all_reduce(group, mx, TT_REDUCE_MAX) != 0) ||
      k->row_partials(r, x, m, tg, i64, ignore_index, vocab_start, N, vl, lc->dtype) != 0 ||
      (!alone && tt_comm_all_reduce(group, red, TT_REDUCE_SUM) != 0) ||
      k->finish(tt_tensor_data(loss), tt_tensor_data(lse), m, r, tg, i64, ignore_index,
                vocab_start, N, vl) != 0)
    goto fail;
  tt_tensor *ins[2] = {logits, targets};
  if (tt_should_record(ins, 2)) {
    tt_node *node = tt_record(OP, vp_ce_backward, loss, ins, 2);
    if (!node) goto fail;
    node->i[0] = ignore_index;
    node->i[1] = vocab_start;
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

/*
** ops_loss.c — tt_cross_entropy: logits (..., V), f32 or bf16 (their gradient in the same
** dtype; the loss and the arithmetic f32), and targets (...) give the scalar mean
** of -log softmax(logits)[target] over the targets that are not ignore_index. When every
** target is ignored the loss is 0 and the backward gives a zero gradient, so a batch made
** only of padding cannot poison the weights with NaN.
**
** Fused: the forward saves only the contiguous logits, the targets and a (2, N) row
** statistics tensor; the backward rebuilds each softmax row from its logsumexp.
*/
#include "core/tt_internal.h"
#include "loss.h"

static int ce_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *logits = node->inputs[0];
  tt_tensor *lc = node->saved[0], *tc = node->saved[1], *stats = node->saved[2];
  if (!tt_needs_grad(logits)) return 0;
  const tt_loss_kernels *k = TT_KERNELS(tt_loss, lc->device);
  if (!k || !k->ce_backward) return tt_no_kernel(node->name, lc->device);
  int64_t V = lc->shape[lc->ndim - 1], N = tt_tensor_numel(tc);
  tt_tensor *g = NULL, *dl = NULL;
  int rc = -1;
  if (tt_contiguous_nograd(grad_out, &g) != 0 || tt_empty_like(lc, &dl) != 0) goto done;
  if (k->ce_backward(tt_tensor_data(dl), tt_tensor_data(g), tt_tensor_data(lc),
                     tt_tensor_data(stats), tt_tensor_data(tc), tc->dtype == TT_I64,
                     node->i[0], N, V, lc->dtype) != 0)
    goto done;
  rc = tt_accumulate_grad(logits, dl);
done:
  tt_tensor_release(g);
  tt_tensor_release(dl);
  return rc;
}

int tt_cross_entropy(tt_tensor *logits, tt_tensor *targets, int64_t ignore_index,
                     tt_tensor **out) {
  char a[96], b[96];
  TT_CHECK(logits && targets && out,
           "cross_entropy: logits, targets and out must not be NULL");
  TT_CHECK(logits->dtype == TT_F32 || logits->dtype == TT_BF16,
           "cross_entropy: logits are %s; expected f32 or bf16", tt_dtype_name(logits->dtype));
  TT_TRY(tt_check_index("cross_entropy", "targets", targets));
  tt_tensor *ins[2] = {logits, targets};
  TT_TRY(tt_check_same_device("cross_entropy", ins, 2));
  int shapes_ok = logits->ndim >= 1 && logits->shape[logits->ndim - 1] >= 1 &&
                  targets->ndim == logits->ndim - 1;
  for (int d = 0; shapes_ok && d < targets->ndim; d++)
    shapes_ok = targets->shape[d] == logits->shape[d];
  if (!shapes_ok)
    return tt_set_error("cross_entropy: logits %s must be (..., V) with V > 0 and targets "
                        "%s must be its leading dims (...)",
                        tt_tensor_describe(logits, a, sizeof a),
                        tt_tensor_describe(targets, b, sizeof b));
  const tt_loss_kernels *k = TT_KERNELS(tt_loss, logits->device);
  if (!k || !k->ce_forward) return tt_no_kernel("cross_entropy", logits->device);
  int64_t V = logits->shape[logits->ndim - 1], N = tt_tensor_numel(targets);
  int64_t stats_shape[2] = {2, N};

  tt_tensor *lc = NULL, *tc = NULL, *stats = NULL, *loss = NULL;
  if (tt_contiguous_nograd(logits, &lc) != 0 || tt_contiguous_nograd(targets, &tc) != 0 ||
      tt_tensor_empty(stats_shape, 2, TT_F32, logits->device, &stats) != 0 ||
      tt_tensor_empty(NULL, 0, TT_F32, logits->device, &loss) != 0)
    goto fail;
  if (k->ce_forward(tt_tensor_data(loss), tt_tensor_data(stats), tt_tensor_data(lc),
                    tt_tensor_data(tc), tc->dtype == TT_I64, ignore_index, N, V,
                    lc->dtype) != 0)
    goto fail;
  if (tt_should_record(ins, 2)) {
    tt_node *node = tt_record("cross_entropy", ce_backward, loss, ins, 2);
    if (!node) goto fail;
    node->i[0] = ignore_index;
    tt_node_save(node, lc);
    tt_node_save(node, tc);
    tt_node_save(node, stats);
  }
  tt_tensor_release(lc);
  tt_tensor_release(tc);
  tt_tensor_release(stats);
  *out = loss;
  return 0;
fail:
  tt_tensor_release(lc);
  tt_tensor_release(tc);
  tt_tensor_release(stats);
  tt_tensor_release(loss);
  return -1;
}

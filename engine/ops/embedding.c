/*
** ops_embedding.c — tt_embedding: weight (V, D) looked up at ids (any shape, i32/i64)
** gives (ids..., D), f32 or (tt_embedding_ex) rounded to bf16. The backward scatter-adds
** the upstream rows (f32 or bf16) into a zeroed f32 (V, D) gradient (kernels/embedding.h
** keeps that deterministic). ids never get a gradient.
*/
#include "core/tt_internal.h"
#include "embedding.h"

static int embedding_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *weight = node->inputs[0], *ids = node->saved[0];
  if (!tt_needs_grad(weight)) return 0;
  const tt_embedding_kernels *k = TT_KERNELS(tt_embedding, weight->device);
  if (!k || !k->backward) return tt_no_kernel(node->name, weight->device);
  tt_tensor *g = NULL, *dw = NULL;
  int rc = -1;
  if (tt_contiguous_nograd(grad_out, &g) != 0 || tt_zeros_like(weight, &dw) != 0) goto done;
  if (k->backward(tt_tensor_data(dw), tt_tensor_data(g), tt_tensor_data(ids),
                  ids->dtype == TT_I64, tt_tensor_numel(ids), weight->shape[0],
                  weight->shape[1], g->dtype, node->i[0]) != 0)
    goto done;
  rc = tt_accumulate_grad(weight, dw);
done:
  tt_tensor_release(g);
  tt_tensor_release(dw);
  return rc;
}

/* The lookup of rows ids - start; ids outside [start, start + V) give zero rows with
** `band`, an error without. */
static int embedding(tt_tensor *weight, tt_tensor *ids, int out_dtype, int64_t start,
                     int band, tt_tensor **out) {
  TT_CHECK(weight && ids && out, "embedding: weight, ids and out must not be NULL");
  TT_TRY(tt_check_dtype("embedding", "weight", weight, TT_F32));
  TT_CHECK(out_dtype == TT_F32 || out_dtype == TT_BF16,
           "embedding: output dtype %s; expected f32 or bf16", tt_dtype_name(out_dtype));
  TT_TRY(tt_check_index("embedding", "ids", ids));
  tt_tensor *ins[2] = {weight, ids};
  TT_TRY(tt_check_same_device("embedding", ins, 2));
  char a[96], b[96];
  if (weight->ndim != 2)
    return tt_set_error("embedding: weight %s must be 2-D (vocab, dim)",
                        tt_tensor_describe(weight, a, sizeof a));
  if (ids->ndim >= TT_MAX_DIMS)
    return tt_set_error("embedding: ids %s has too many dims (at most %d)",
                        tt_tensor_describe(ids, b, sizeof b), TT_MAX_DIMS - 1);
  const tt_embedding_kernels *k = TT_KERNELS(tt_embedding, weight->device);
  if (!k || !k->forward) return tt_no_kernel("embedding", weight->device);

  int64_t shape[TT_MAX_DIMS];
  for (int d = 0; d < ids->ndim; d++) shape[d] = ids->shape[d];
  shape[ids->ndim] = weight->shape[1];
  tt_tensor *wc = NULL, *idc = NULL, *y = NULL;
  if (tt_contiguous_nograd(weight, &wc) != 0 || tt_contiguous_nograd(ids, &idc) != 0 ||
      tt_tensor_empty(shape, ids->ndim + 1, out_dtype, weight->device, &y) != 0)
    goto fail;
  if (k->forward(tt_tensor_data(y), tt_tensor_data(wc), tt_tensor_data(idc),
                 idc->dtype == TT_I64, tt_tensor_numel(idc), wc->shape[0],
                 wc->shape[1], out_dtype, start, band) != 0)
    goto fail;
  if (tt_should_record(ins, 2)) {
    tt_node *node = tt_record("embedding", embedding_backward, y, ins, 2);
    if (!node) goto fail;
    tt_node_save(node, idc);
    node->i[0] = start;
  }
  tt_tensor_release(wc);
  tt_tensor_release(idc);
  *out = y;
  return 0;
fail:
  tt_tensor_release(wc);
  tt_tensor_release(idc);
  tt_tensor_release(y);
  return -1;
}

int tt_embedding_ex(tt_tensor *weight, tt_tensor *ids, int out_dtype, tt_tensor **out) {
  return embedding(weight, ids, out_dtype, 0, 0, out);
}

int tt_embedding(tt_tensor *weight, tt_tensor *ids, tt_tensor **out) {
  return tt_embedding_ex(weight, ids, TT_F32, out);
}

int tt_embedding_band(tt_tensor *weight, tt_tensor *ids, int64_t start, int out_dtype,
                      tt_tensor **out) {
  TT_CHECK(start >= 0, "embedding_band: start %lld is negative", (long long)start);
  return embedding(weight, ids, out_dtype, start, 1, out);
}

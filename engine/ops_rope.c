/*
** ops_rope.c — tt_rope: rotary position embedding of x (B, T, H, Dh). The forward builds
** the (2, T, Dh/2) cos/sin table once and saves it; the backward rotates the upstream
** gradient by the opposite angles with the same table. positions never get a gradient.
*/
#include "tt_internal.h"
#include "rope.h"
#include <math.h>

static int rope_backward(tt_node *node, tt_tensor *grad_out) {
  tt_tensor *x = node->inputs[0], *table = node->saved[0];
  if (!tt_needs_grad(x)) return 0;
  const tt_rope_kernels *k = TT_KERNELS(tt_rope, x->device);
  if (!k || !k->backward) return tt_no_kernel(node->name, x->device);
  tt_tensor *g = NULL, *dx = NULL;
  int rc = -1;
  if (tt_contiguous_nograd(grad_out, &g) != 0 || tt_empty_like(g, &dx) != 0) goto done;
  if (k->backward(tt_tensor_data(dx), tt_tensor_data(g), tt_tensor_data(table),
                  x->shape[0], x->shape[1], x->shape[2], x->shape[3],
                  (int)node->i[0]) != 0)
    goto done;
  rc = tt_accumulate_grad(x, dx);
done:
  tt_tensor_release(g);
  tt_tensor_release(dx);
  return rc;
}

int tt_rope(tt_tensor *x, tt_tensor *positions, double theta, int interleaved,
            tt_tensor **out) {
  char a[96], b[96];
  TT_CHECK(x && out, "rope: x and out must not be NULL");
  TT_TRY(tt_check_dtype("rope", "x", x, TT_F32));
  if (x->ndim != 4 || x->shape[3] < 2 || x->shape[3] % 2 != 0)
    return tt_set_error("rope: x %s must be (B, T, H, Dh) with Dh even and > 0",
                        tt_tensor_describe(x, a, sizeof a));
  if (!(theta > 0.0) || !isfinite(theta))
    return tt_set_error("rope: theta must be finite and > 0 (got %g)", theta);
  int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], Dh = x->shape[3];
  if (positions) {
    TT_TRY(tt_check_index("rope", "positions", positions));
    tt_tensor *pair[2] = {x, positions};
    TT_TRY(tt_check_same_device("rope", pair, 2));
    if (positions->ndim != 1 || positions->shape[0] != T)
      return tt_set_error("rope: positions %s must be (T) = (%lld) for x %s",
                          tt_tensor_describe(positions, b, sizeof b), (long long)T,
                          tt_tensor_describe(x, a, sizeof a));
  }
  const tt_rope_kernels *k = TT_KERNELS(tt_rope, x->device);
  if (!k || !k->table || !k->forward) return tt_no_kernel("rope", x->device);

  int64_t table_shape[3] = {2, T, Dh / 2};
  tt_tensor *xc = NULL, *pc = NULL, *table = NULL, *y = NULL;
  if (tt_contiguous_nograd(x, &xc) != 0 || (positions && tt_contiguous_nograd(positions, &pc) != 0) ||
      tt_tensor_empty(table_shape, 3, TT_F32, x->device, &table) != 0 ||
      tt_empty_like(xc, &y) != 0)
    goto fail;
  if (k->table(tt_tensor_data(table), pc ? tt_tensor_data(pc) : NULL,
               pc && pc->dtype == TT_I64, T, Dh, theta) != 0 ||
      k->forward(tt_tensor_data(y), tt_tensor_data(xc), tt_tensor_data(table), B, T, H, Dh,
                 interleaved != 0) != 0)
    goto fail;
  tt_tensor *ins[2] = {x, positions};
  if (tt_should_record(ins, 2)) {
    tt_node *node = tt_record("rope", rope_backward, y, ins, 2);
    if (!node) goto fail;
    node->i[0] = interleaved != 0;
    tt_node_save(node, table);
  }
  tt_tensor_release(xc);
  tt_tensor_release(pc);
  tt_tensor_release(table);
  *out = y;
  return 0;
fail:
  tt_tensor_release(xc);
  tt_tensor_release(pc);
  tt_tensor_release(table);
  tt_tensor_release(y);
  return -1;
}

/*
** ops_rope.c — tt_rope and tt_rope_: rotary position embedding of x (B, T, H, Dh), f32 or
** bf16 (rotated in f32, rounded once). The forward builds the (2, T, Dh/2) cos/sin table
** once and saves it; the backward rotates the upstream gradient by the opposite angles
** with the same table, so it never needs x. tt_rope_ rotates x's own memory: no second
** (B, T, H, Dh) buffer. positions never get a gradient.
*/
#include "core/tt_internal.h"
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
                  (int)node->i[0], g->dtype) != 0)
    goto done;
  rc = tt_accumulate_grad(x, dx);
done:
  tt_tensor_release(g);
  tt_tensor_release(dx);
  return rc;
}

static int check_args(const char *op, tt_tensor *x, tt_tensor *positions, double theta) {
  char a[96], b[96];
  TT_CHECK(x->dtype == TT_F32 || x->dtype == TT_BF16, "%s: x is %s; expected f32 or bf16", op,
           tt_dtype_name(x->dtype));
  if (x->ndim != 4 || x->shape[3] < 2 || x->shape[3] % 2 != 0)
    return tt_set_error("%s: x %s must be (B, T, H, Dh) with Dh even and > 0", op,
                        tt_tensor_describe(x, a, sizeof a));
  if (!(theta > 0.0) || !isfinite(theta))
    return tt_set_error("%s: theta must be finite and > 0 (got %g)", op, theta);
  if (positions) {
    TT_TRY(tt_check_index(op, "positions", positions));
    tt_tensor *pair[2] = {x, positions};
    TT_TRY(tt_check_same_device(op, pair, 2));
    if (positions->ndim != 1 || positions->shape[0] != x->shape[1])
      return tt_set_error("%s: positions %s must be (T) = (%lld) for x %s", op,
                          tt_tensor_describe(positions, b, sizeof b), (long long)x->shape[1],
                          tt_tensor_describe(x, a, sizeof a));
  }
  return 0;
}

/* Both ops: in_place rotates x's memory and returns a tensor sharing it. */
static int rope(const char *op, tt_tensor *x, tt_tensor *positions, double theta,
                int interleaved, int in_place, tt_tensor **out) {
  char a[96];
  TT_CHECK(x && out, "%s: x and out must not be NULL", op);
  *out = NULL;
  TT_TRY(check_args(op, x, positions, theta));
  if (in_place)
    TT_CHECK(tt_tensor_is_contiguous(x) && !(x->is_leaf && x->requires_grad),
             "%s: x %s must be contiguous and not a leaf that requires grad to be rotated in "
             "place (tt_rope makes a copy)", op, tt_tensor_describe(x, a, sizeof a));
  const int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], Dh = x->shape[3];
  const tt_rope_kernels *k = TT_KERNELS(tt_rope, x->device);
  if (!k || !k->table || !k->forward) return tt_no_kernel(op, x->device);

  int64_t table_shape[3] = {2, T, Dh / 2};
  tt_tensor *xc = NULL, *pc = NULL, *table = NULL, *y = NULL;
  if (in_place) {
    tt_tensor_retain(x);
    xc = x;
  } else if (tt_contiguous_nograd(x, &xc) != 0) {
    goto fail;
  }
  if ((positions && tt_contiguous_nograd(positions, &pc) != 0) ||
      tt_tensor_empty(table_shape, 3, TT_F32, x->device, &table) != 0 ||
      (in_place ? tt_detach(x, &y) : tt_empty_like(xc, &y)) != 0)
    goto fail;
  if (k->table(tt_tensor_data(table), pc ? tt_tensor_data(pc) : NULL,
               pc && pc->dtype == TT_I64, T, Dh, theta) != 0 ||
      k->forward(tt_tensor_data(y), tt_tensor_data(xc), tt_tensor_data(table), B, T, H, Dh,
                 interleaved != 0, x->dtype) != 0)
    goto fail;
  if (in_place) tt_tensor_bump_version(x);
  tt_tensor *ins[2] = {x, positions};
  if (tt_should_record(ins, 2)) {
    tt_node *node = tt_record(op, rope_backward, y, ins, 2);
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

int tt_rope(tt_tensor *x, tt_tensor *positions, double theta, int interleaved,
            tt_tensor **out) {
  return rope("rope", x, positions, theta, interleaved, 0, out);
}

int tt_rope_(tt_tensor *x, tt_tensor *positions, double theta, int interleaved,
             tt_tensor **out) {
  return rope("rope_", x, positions, theta, interleaved, 1, out);
}

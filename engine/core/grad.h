/*
** grad.h — the sums gradients need, shared by autograd, the views' backward and the ops
** (engine/core/grad.c): the broadcast description of the elementwise kernels and the plan
** that maps a reduction onto the reduce kernels' (outer, r, inner) block.
*/
#ifndef TT_GRAD_H
#define TT_GRAD_H
#include "core/tt_internal.h"
#include "elementwise.h"
#include "reduce.h"

/* Describes out (shape, contiguous) = f(a, b) for the kernels, with size-1 dims dropped
** and neighbouring dims merged wherever both inputs stay uniformly strided. A dense
** same-shape op ends up 1-D. */
void tt_bcast_build(tt_bcast *bc, const int64_t *shape, int ndim, const tt_tensor *a,
                    const tt_tensor *b);

/* How x maps onto the kernels' (outer, r, inner). When `permuted`, x is first copied
** as x.permute(perm) (kept dims, then reduced dims). */
typedef struct tt_reduce_plan {
  int64_t outer, r, inner;
  int permuted;
  int perm[TT_MAX_DIMS];
} tt_reduce_plan;

/* Builds the plan for reducing the dims flagged in `reduced` (one flag per dim of x). */
void tt_reduce_plan_build(const tt_tensor *x, const int *reduced, tt_reduce_plan *p);
/* x laid out as the plan's (outer, r, inner) block: x itself when possible, else a
** contiguous copy of the permuted view. */
int tt_reduce_plan_input(tt_tensor *x, const tt_reduce_plan *p, tt_tensor **out);
/* out = scale * sum of x per the plan; out already has the right number of elements. */
int tt_reduce_plan_sum(const char *op, tt_tensor *x, const tt_reduce_plan *p, float scale,
                       tt_tensor *out);

#endif

/*
** copy_geom.c — a strided copy's index space with its size-1 dimensions dropped and its
** contiguous neighbours merged (copy_geom.h).
*/
#include "copy_geom.h"
#include <string.h>

void tt_copy_geom_make(tt_copy_geom *g, int ndim, const int64_t *shape,
                       const int64_t *dst_stride, const int64_t *src_stride) {
  memset(g, 0, sizeof *g);
  g->n = 1;
  for (int d = 0; d < ndim; d++) g->n *= shape[d];
  /* Innermost first: g's dims are built in reverse, then turned around. */
  int m = 0;
  for (int d = ndim - 1; d >= 0; d--) {
    if (shape[d] == 1) continue;
    if (m > 0 && dst_stride[d] == g->dst_stride[m - 1] * g->shape[m - 1] &&
        src_stride[d] == g->src_stride[m - 1] * g->shape[m - 1]) {
      g->shape[m - 1] *= shape[d];   /* d continues the run below it on both sides */
      continue;
    }
    g->shape[m] = shape[d];
    g->dst_stride[m] = dst_stride[d];
    g->src_stride[m] = src_stride[d];
    m++;
  }
  if (m == 0 || g->n == 0) {   /* one element, or none: a single dimension */
    m = 1;
    g->shape[0] = g->n;
    g->dst_stride[0] = g->src_stride[0] = 1;
  }
  for (int i = 0, j = m - 1; i < j; i++, j--) {
    int64_t t = g->shape[i]; g->shape[i] = g->shape[j]; g->shape[j] = t;
    t = g->dst_stride[i]; g->dst_stride[i] = g->dst_stride[j]; g->dst_stride[j] = t;
    t = g->src_stride[i]; g->src_stride[i] = g->src_stride[j]; g->src_stride[j] = t;
  }
  g->ndim = m;
  /* 32-bit index math: the count and the farthest offset on each side below 2^31 (each
  ** partial sum is at most the total, so nothing on the way overflows either). Negative
  ** strides keep 64 bits. */
  const int64_t lim = INT32_MAX;
  int fits = g->n <= lim;
  int64_t dmax = 0, smax = 0;
  for (int d = 0; d < m && fits; d++) {
    if (g->dst_stride[d] < 0 || g->src_stride[d] < 0) fits = 0;
    else if (g->shape[d] > 1 && (g->dst_stride[d] > lim / (g->shape[d] - 1) ||
                                 g->src_stride[d] > lim / (g->shape[d] - 1)))
      fits = 0;
    else {
      dmax += (g->shape[d] - 1) * g->dst_stride[d];
      smax += (g->shape[d] - 1) * g->src_stride[d];
      fits = dmax <= lim && smax <= lim;
    }
  }
  g->index32 = fits;
}

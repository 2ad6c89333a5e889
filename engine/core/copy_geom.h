/*
** copy_geom.h — the index space of a strided copy, made as small as it can be before a
** kernel walks it (engine/cuda/copy.cu).
**
** A copy kernel turns each element's index into an offset on either side with a division
** and a remainder per dimension. Two things shrink that work without changing which
** element goes where:
**   - dimensions of size 1 contribute nothing and are dropped;
**   - two neighbouring dimensions that are contiguous with each other on both sides
**     (outer stride = inner stride x inner size, for the destination and the source
**     alike) are one dimension: a contiguous tensor becomes a single run, a transpose
**     of the last two dimensions of a (B, H, T, D) tensor three dimensions at most.
** And when the element count and every offset reached on either side fit in 31 bits,
** the kernel can do its index math in 32 bits (index32), which GPUs divide far faster
** than 64-bit integers.
*/
#ifndef TT_COPY_GEOM_H
#define TT_COPY_GEOM_H
#include <stdint.h>
#include "tetra.h"

typedef struct tt_copy_geom {
  int ndim;        /* at least 1: a single element is one dimension of size 1 */
  int index32;     /* n and the largest offset on either side are below 2^31 */
  int64_t n;       /* elements */
  int64_t shape[TT_MAX_DIMS];
  int64_t dst_stride[TT_MAX_DIMS];
  int64_t src_stride[TT_MAX_DIMS];
} tt_copy_geom;

/* The simplified geometry of a copy of `ndim` dimensions (0 to TT_MAX_DIMS) of `shape`
** between a destination and a source with these strides (in elements). Element i of the
** row-major index space of the result is at the same offsets as element i of the
** original. */
void tt_copy_geom_make(tt_copy_geom *g, int ndim, const int64_t *shape,
                       const int64_t *dst_stride, const int64_t *src_stride);

#endif

/*
** The strided copy's simplified index space (engine/core/copy_geom.h), which the CUDA copy
** kernel walks: every element keeps both of its offsets, contiguous runs merge, size-1
** dimensions go, and 32-bit index math is chosen only when the count and every offset fit.
*/
#include "tt_test.h"
#include "core/copy_geom.h"
#include <stdlib.h>

/* Offsets of element i of a row-major index space: the kernel's walk, on the host. */
static void naive_offsets(int ndim, const int64_t *shape, const int64_t *ds, const int64_t *ss,
                          int64_t i, int64_t *d, int64_t *s) {
  *d = *s = 0;
  for (int k = ndim - 1; k >= 0; k--) {
    const int64_t c = i % shape[k];
    i /= shape[k];
    *d += c * ds[k];
    *s += c * ss[k];
  }
}

static void expect_same_walk(int ndim, const int64_t *shape, const int64_t *ds,
                             const int64_t *ss) {
  tt_copy_geom g;
  tt_copy_geom_make(&g, ndim, shape, ds, ss);
  int64_t n = 1;
  for (int k = 0; k < ndim; k++) n *= shape[k];
  cr_assert_eq(g.n, n);
  cr_assert(g.ndim >= 1 && g.ndim <= (ndim > 0 ? ndim : 1));
  for (int64_t i = 0; i < n; i++) {
    int64_t d0, s0, d1, s1;
    naive_offsets(ndim, shape, ds, ss, i, &d0, &s0);
    naive_offsets(g.ndim, g.shape, g.dst_stride, g.src_stride, i, &d1, &s1);
    cr_assert(d0 == d1 && s0 == s1,
              "element %lld: offsets (%lld, %lld), the simplified walk gives (%lld, %lld)",
              (long long)i, (long long)d0, (long long)s0, (long long)d1, (long long)s1);
  }
}

Test(copy_geom, contiguous_is_one_run) {
  const int64_t shape[3] = {2, 3, 4}, st[3] = {12, 4, 1};
  tt_copy_geom g;
  tt_copy_geom_make(&g, 3, shape, st, st);
  cr_assert_eq(g.ndim, 1);
  cr_assert_eq(g.shape[0], 24);
  cr_assert(g.dst_stride[0] == 1 && g.src_stride[0] == 1);
  cr_assert(g.index32);
}

Test(copy_geom, transpose_of_the_last_two_merges_the_rest) {
  /* (2, 3, 4, 5) contiguous <- the (2, 3, 5, 4) contiguous tensor transposed. */
  const int64_t shape[4] = {2, 3, 4, 5}, ds[4] = {60, 20, 5, 1}, ss[4] = {60, 20, 1, 4};
  tt_copy_geom g;
  tt_copy_geom_make(&g, 4, shape, ds, ss);
  cr_assert_eq(g.ndim, 3);
  cr_assert(g.shape[0] == 6 && g.shape[1] == 4 && g.shape[2] == 5);
  cr_assert(g.dst_stride[0] == 20 && g.src_stride[0] == 20);
  expect_same_walk(4, shape, ds, ss);
}

Test(copy_geom, size_one_dims_dropped) {
  /* A (1, 4, 1, 3) slice of a wider tensor: its size-1 strides are anything. */
  const int64_t shape[4] = {1, 4, 1, 3}, ds[4] = {12, 3, 3, 1}, ss[4] = {999, 10, 77, 1};
  tt_copy_geom g;
  tt_copy_geom_make(&g, 4, shape, ds, ss);
  cr_assert_eq(g.ndim, 2);
  cr_assert(g.shape[0] == 4 && g.shape[1] == 3);
  expect_same_walk(4, shape, ds, ss);
}

Test(copy_geom, only_both_sides_contiguous_merge) {
  /* Contiguous on the destination only (the source's rows are 8 apart, 4 used). */
  const int64_t shape[2] = {3, 4}, ds[2] = {4, 1}, ss[2] = {8, 1};
  tt_copy_geom g;
  tt_copy_geom_make(&g, 2, shape, ds, ss);
  cr_assert_eq(g.ndim, 2);
  expect_same_walk(2, shape, ds, ss);
}

Test(copy_geom, scalars_and_empty) {
  tt_copy_geom g;
  tt_copy_geom_make(&g, 0, NULL, NULL, NULL);
  cr_assert(g.ndim == 1 && g.n == 1 && g.shape[0] == 1);
  const int64_t shape[3] = {4, 0, 5}, st[3] = {5, 5, 1};
  tt_copy_geom_make(&g, 3, shape, st, st);
  cr_assert(g.ndim == 1 && g.n == 0 && g.shape[0] == 0);
}

Test(copy_geom, random_views_walk_the_same_elements) {
  srand(7);
  for (int trial = 0; trial < 2000; trial++) {
    int ndim = rand() % (TT_MAX_DIMS + 1);
    int64_t shape[TT_MAX_DIMS], ds[TT_MAX_DIMS], ss[TT_MAX_DIMS];
    int64_t dn = 1, sn = 1;
    /* Contiguous on each side, from the innermost dimension out, each side sometimes
    ** padded (a narrowed view) or broadcast (stride 0); then dimensions swapped. */
    for (int k = ndim - 1; k >= 0; k--) {
      shape[k] = 1 + rand() % 3;
      ds[k] = dn;
      ss[k] = rand() % 7 == 0 ? 0 : sn;
      dn *= shape[k] + (rand() % 5 == 0);
      sn *= shape[k] + (rand() % 5 == 0);
    }
    for (int swaps = rand() % 3; swaps > 0 && ndim > 1; swaps--) {
      int a = rand() % ndim, b = rand() % ndim;
      int64_t t = shape[a]; shape[a] = shape[b]; shape[b] = t;
      t = ss[a]; ss[a] = ss[b]; ss[b] = t;
      if (rand() % 2) { t = ds[a]; ds[a] = ds[b]; ds[b] = t; }
    }
    expect_same_walk(ndim, shape, ds, ss);
  }
}

Test(copy_geom, index32_only_when_everything_fits) {
  tt_copy_geom g;
  const int64_t one[1] = {1};
  int64_t n = INT32_MAX;
  tt_copy_geom_make(&g, 1, &n, one, one);
  cr_assert(g.index32, "2^31 - 1 elements fit");
  n = (int64_t)INT32_MAX + 1;
  tt_copy_geom_make(&g, 1, &n, one, one);
  cr_assert(!g.index32, "2^31 elements do not");
  /* Few elements, but the source's farthest offset is 2^31 (rows 2^30 apart). */
  const int64_t shape[2] = {3, 2}, ds[2] = {2, 1}, far[2] = {(int64_t)1 << 30, 1};
  tt_copy_geom_make(&g, 2, shape, ds, far);
  cr_assert(!g.index32, "an offset of 2^31 needs 64 bits");
  const int64_t near[2] = {((int64_t)1 << 30) - 1, 1};
  tt_copy_geom_make(&g, 2, shape, ds, near);
  cr_assert(g.index32, "the farthest offset 2^31 - 1 fits");
  /* Each dimension's reach fits, their sum (2^30 + 2 x 2^29 = 2^31) does not. */
  const int64_t shape2[2] = {2, 3}, ds2[2] = {3, 1}, sum[2] = {(int64_t)1 << 30, (int64_t)1 << 29};
  tt_copy_geom_make(&g, 2, shape2, ds2, sum);
  cr_assert(!g.index32, "the farthest offset is the sum over the dimensions");
  tt_copy_geom_make(&g, 2, shape2, sum, ds2);
  cr_assert(!g.index32, "on the destination as on the source");
  /* A stride so large that stride x size overflows int64 still says no. */
  const int64_t huge[2] = {INT64_MAX / 2, 1};
  tt_copy_geom_make(&g, 2, shape, ds, huge);
  cr_assert(!g.index32);
  const int64_t neg[2] = {-2, 1};
  tt_copy_geom_make(&g, 2, shape, ds, neg);
  cr_assert(!g.index32, "negative strides keep 64 bits");
}

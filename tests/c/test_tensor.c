/*
** Tensors: creation, views sharing storage, contiguous copies, casts between the float
** formats (round-to-nearest-even, saturation, NaN/Inf), allocator accounting, bad input.
*/
#include "tt_test.h"
#include <math.h>

static tt_tensor *arange_f32(int64_t n) {
  tt_tensor *t = NULL;
  cr_assert(tt_tensor_empty(&n, 1, TT_F32, TT_CPU, &t) == 0);
  for (int64_t i = 0; i < n; i++) ((float *)tt_tensor_data(t))[i] = (float)i;
  return t;
}

Test(tensor, create_and_fill) {
  int64_t shape[3] = {3, 5, 7};
  tt_tensor *z = NULL, *f = NULL;
  cr_assert(tt_tensor_zeros(shape, 3, TT_F32, TT_CPU, &z) == 0);
  cr_assert(tt_tensor_full(shape, 3, TT_I64, TT_CPU, -4.0, &f) == 0);
  cr_assert_eq(tt_tensor_numel(z), 105);
  cr_assert(tt_tensor_is_contiguous(z));
  cr_assert_eq(z->stride[0], 35);
  cr_assert_eq(z->stride[2], 1);
  for (int64_t i = 0; i < 105; i++) {
    cr_assert_eq(tt_tensor_get(z, i), 0.0);
    cr_assert_eq(tt_tensor_get(f, i), -4.0);
  }
  char buf[64];
  cr_assert_str_eq(tt_tensor_describe(f, buf, sizeof buf), "i64[3, 5, 7] cpu");
  tt_tensor_release(z);
  tt_tensor_release(f);
}

Test(tensor, views_share_storage) {
  tt_tensor *t = arange_f32(24), *v = NULL, *tr = NULL, *nr = NULL, *pm = NULL;
  int64_t shape[3] = {2, 3, 4};
  cr_assert(tt_view(t, shape, 3, &v) == 0);
  cr_assert_eq(v->storage, t->storage);
  /* transpose(0, 2): element [i][j][k] of tr is v[k][j][i] = k*12 + j*4 + i */
  cr_assert(tt_transpose(v, 0, 2, &tr) == 0);
  cr_assert_eq(tr->shape[0], 4);
  cr_assert(!tt_tensor_is_contiguous(tr));
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 2; k++)
        cr_assert_eq(tt_tensor_get(tr, (i * 3 + j) * 2 + k), k * 12 + j * 4 + i);
  /* narrow dim 1 to [1, 3) of v: v[i][1 + j][k] */
  cr_assert(tt_narrow(v, 1, 1, 2, &nr) == 0);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 4; k++)
        cr_assert_eq(tt_tensor_get(nr, (i * 2 + j) * 4 + k), i * 12 + (1 + j) * 4 + k);
  /* permute (1, 2, 0): pm[a][b][c] = v[c][a][b] */
  int dims[3] = {1, 2, 0};
  cr_assert(tt_permute(v, dims, 3, &pm) == 0);
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 2; c++)
        cr_assert_eq(tt_tensor_get(pm, (a * 4 + b) * 2 + c), c * 12 + a * 4 + b);
  /* Writing through a view is seen by the base. */
  cr_assert(tt_tensor_set(nr, 0, 100.0) == 0);
  cr_assert_eq(tt_tensor_get(t, 4), 100.0);
  tt_tensor *views[] = {t, v, tr, nr, pm};
  for (int i = 0; i < 5; i++) tt_tensor_release(views[i]);
}

Test(tensor, contiguous_and_reshape_of_strided) {
  tt_tensor *t = arange_f32(12), *v = NULL, *tr = NULL, *c = NULL, *r = NULL;
  int64_t shape[2] = {3, 4}, flat[1] = {-1};
  cr_assert(tt_view(t, shape, 2, &v) == 0);
  cr_assert(tt_transpose(v, 0, 1, &tr) == 0);
  cr_assert(tt_contiguous(tr, &c) == 0);
  cr_assert(tt_tensor_is_contiguous(c));
  cr_assert_neq(c->storage, t->storage);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) cr_assert_eq(tt_tensor_get(c, i * 3 + j), j * 4 + i);
  /* Reshaping a non-contiguous view copies (reshape semantics) and infers -1. */
  cr_assert(tt_view(tr, flat, 1, &r) == 0);
  cr_assert_eq(r->shape[0], 12);
  for (int i = 0; i < 12; i++) cr_assert_eq(tt_tensor_get(r, i), tt_tensor_get(c, i));
  tt_tensor *all[] = {t, v, tr, c, r};
  for (int i = 0; i < 5; i++) tt_tensor_release(all[i]);
}

Test(tensor, expand_is_zero_stride) {
  tt_tensor *t = arange_f32(3), *e = NULL;
  int64_t shape[3] = {2, 4, 3};
  cr_assert(tt_expand(t, shape, 3, &e) == 0);
  cr_assert_eq(e->stride[0], 0);
  cr_assert_eq(e->stride[1], 0);
  for (int i = 0; i < 24; i++) cr_assert_eq(tt_tensor_get(e, i), i % 3);
  int64_t bad[2] = {2, 4};
  tt_tensor *x = NULL;
  tt_test_assert_error(tt_expand(t, bad, 2, &x), "cannot expand [3] to [2, 4]");
  tt_tensor_release(t);
  tt_tensor_release(e);
}

Test(tensor, bad_shapes_rejected) {
  tt_tensor *t = arange_f32(12), *x = NULL;
  int64_t s1[2] = {5, 3}, s2[2] = {-1, -1}, s3[2] = {5, -1};
  tt_test_assert_error(tt_view(t, s1, 2, &x), "view: shape [5, 3] has 15 elements");
  tt_test_assert_error(tt_view(t, s2, 2, &x), "only one dimension can be -1");
  tt_test_assert_error(tt_view(t, s3, 2, &x), "cannot infer -1");
  tt_test_assert_error(tt_narrow(t, 0, 10, 5, &x), "out of bounds");
  tt_test_assert_error(tt_transpose(t, 0, 3, &x), "dim 3 out of range");
  int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  tt_test_assert_error(tt_tensor_empty(nine, 9, TT_F32, TT_CPU, &x), "at most 8");
  int64_t neg[1] = {-2};
  tt_test_assert_error(tt_tensor_empty(neg, 1, TT_F32, TT_CPU, &x), "negative size");
  tt_test_assert_error(tt_to_device(t, 0, &x), "cuda:0 is not available");
  tt_tensor_release(t);
}

Test(tensor, shapes_overflowing_64_bits_are_rejected) {
  /* Fuzzer reproducer: 2^32 * 2^32 * 3 overflows int64 (undefined behaviour; in practice
  ** it wrapped to 0 and gave a tensor over a 0-byte buffer). */
  int64_t wrap[3] = {INT64_C(1) << 32, INT64_C(1) << 32, 3};
  tt_tensor *x = NULL;
  tt_test_assert_error(tt_tensor_empty(wrap, 3, TT_F32, TT_CPU, &x),
                       "empty: shape [4294967296, 4294967296, 3] is too large");
  tt_test_assert_error(tt_tensor_zeros(wrap, 3, TT_F32, TT_CPU, &x), "too large");
  tt_test_assert_error(tt_tensor_randn(wrap, 3, 0.0, 1.0, &x), "too large");
  float buf[1];
  tt_test_assert_error(tt_tensor_from_buffer(buf, wrap, 3, TT_F32, &x), "too large");
  /* The element count fits but the byte count does not: 2^62 f32 are 2^64 bytes. */
  int64_t bytes[1] = {INT64_C(1) << 62};
  tt_test_assert_error(tt_tensor_empty(bytes, 1, TT_F32, TT_CPU, &x), "too large");
  /* A view or an expand must not give an existing tensor such a shape either: the product
  ** wrapped to 0, the element count of an empty tensor, or overflowed tt_tensor_numel. */
  int64_t none[1] = {0}, one[1] = {1}, wrap0[3] = {INT64_C(1) << 32, INT64_C(1) << 32, 4};
  tt_tensor *e = NULL, *o = NULL;
  cr_assert(tt_tensor_empty(none, 1, TT_F32, TT_CPU, &e) == 0, "%s", tt_last_error());
  cr_assert(tt_tensor_zeros(one, 1, TT_F32, TT_CPU, &o) == 0, "%s", tt_last_error());
  tt_test_assert_error(tt_view(e, wrap0, 3, &x),
                       "view: shape [4294967296, 4294967296, 4] is too large");
  int64_t infer[3] = {INT64_C(1) << 32, INT64_C(1) << 32, -1};
  tt_test_assert_error(tt_view(o, infer, 3, &x),
                       "view: shape [4294967296, 4294967296, -1] is too large");
  tt_test_assert_error(tt_expand(o, wrap, 3, &x),
                       "expand: shape [4294967296, 4294967296, 3] is too large");
  /* Empty tensors with large other sizes are fine while their strides fit. */
  int64_t wide[2] = {0, INT64_C(1) << 40};
  cr_assert(tt_tensor_empty(wide, 2, TT_F32, TT_CPU, &x) == 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_numel(x), 0);
  cr_assert_eq(x->stride[0], INT64_C(1) << 40);
  tt_tensor_release(x);
  tt_tensor_release(e);
  tt_tensor_release(o);
}

/* -- Casts --------------------------------------------------------------------------- */

Test(cast, bf16_round_to_nearest_even) {
  /* 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even (1).
  ** 1 + 3*2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6). */
  cr_assert_eq(tt_bf16_to_float(tt_float_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  cr_assert_eq(tt_bf16_to_float(tt_float_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  cr_assert_eq(tt_bf16_to_float(tt_float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  cr_assert(isinf(tt_bf16_to_float(tt_float_to_bf16(INFINITY))));
  cr_assert(isnan(tt_bf16_to_float(tt_float_to_bf16(NAN))));
  cr_assert(isinf(tt_bf16_to_float(tt_float_to_bf16(3.4e38f))));   /* rounds past max */
  /* Round trip of every bf16 bit pattern (finite ones) is exact. */
  for (uint32_t h = 0; h < 65536; h++) {
    float f = tt_bf16_to_float((uint16_t)h);
    if (isnan(f)) continue;
    cr_assert_eq(tt_float_to_bf16(f), h, "bf16 pattern %04x", h);
  }
}

/* Integers past 2^24 cast to bf16 round once, to the nearest (as the GPU's double-to-
** bf16 conversion does), not through the nearest float first: 2^24 + 2^16 + 1 is just
** above the tie between bf16 2^24 and 2^24 + 2^17, but its nearest float, 2^24 + 2^16, is
** the tie itself, which rounds to even (2^24). On the tie and below it the two agree. (f16
** and fp8 saturate long before 2^24, where every integer is a float.) */
Test(cast, integers_round_once_to_bf16) {
  const int64_t shape[1] = {4};
  const int64_t v[4] = {16842753, 16842752, 16842751, -16842753};
  const double want[4] = {16908288, 16777216, 16777216, -16908288};
  tt_tensor *src = NULL, *b = NULL;
  cr_assert_eq(tt_tensor_empty(shape, 1, TT_I64, TT_CPU, &src), 0);
  memcpy(tt_tensor_data(src), v, sizeof v);
  cr_assert_eq(tt_cast(src, TT_BF16, &b), 0, "%s", tt_last_error());
  for (int i = 0; i < 4; i++)
    cr_assert_eq(tt_tensor_get(b, i), want[i], "bf16 of %lld: %.9g, want %.9g",
                 (long long)v[i], tt_tensor_get(b, i), want[i]);
  tt_tensor_release(src);
  tt_tensor_release(b);
}

Test(cast, f16_round_trip_and_rounding) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = tt_f16_to_float((uint16_t)h);
    if (isnan(f)) {
      cr_assert(isnan(tt_f16_to_float(tt_float_to_f16(f))));
      continue;
    }
    cr_assert_eq(tt_float_to_f16(f), h, "f16 pattern %04x (%g)", h, f);
  }
  cr_assert_eq(tt_f16_to_float(tt_float_to_f16(65504.0f)), 65504.0f);
  cr_assert(isinf(tt_f16_to_float(tt_float_to_f16(65520.0f))));   /* halfway past max: inf */
  cr_assert_eq(tt_f16_to_float(tt_float_to_f16(0x1p-24f)), 0x1p-24f);   /* smallest subnormal */
  cr_assert_eq(tt_f16_to_float(tt_float_to_f16(0x1p-26f)), 0.0f);       /* below half of it */
  /* 2049 is halfway between 2048 and 2050: ties to even mantissa (2048). */
  cr_assert_eq(tt_f16_to_float(tt_float_to_f16(2049.0f)), 2048.0f);
  cr_assert_eq(tt_f16_to_float(tt_float_to_f16(2051.0f)), 2052.0f);
}

/* f16 narrowing against the nearest half found by search: the finite non-negative halves
** are codes 0..0x7bff in increasing order, so a value's neighbours come from a binary
** search; the nearer wins, a tie goes to the even code, and from 65520 (halfway past the
** largest, 65504) on it is infinity. Checked on every 251st f32 bit pattern (17 million,
** both signs, zeros, subnormals, NaNs) and on every pattern next to a halfway point. */
static uint16_t f16_reference(float x) {
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  double a = fabs((double)x);
  if (isnan(x)) return sign | 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;
  int lo = 0, hi = 0x7bff;   /* largest code whose value is <= a */
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if ((double)tt_f16_to_float((uint16_t)mid) <= a) lo = mid; else hi = mid - 1;
  }
  if (lo == 0x7bff) return sign | 0x7bff;
  double below = tt_f16_to_float((uint16_t)lo), above = tt_f16_to_float((uint16_t)(lo + 1));
  int code = a - below < above - a ? lo : a - below > above - a ? lo + 1 : (lo % 2 ? lo + 1 : lo);
  return (uint16_t)(sign | code);
}

Test(cast, f16_narrowing_is_the_nearest_half) {
  for (uint64_t i = 0; i <= 0xffffffffull; i += 251) {
    uint32_t u = (uint32_t)i;
    float x;
    memcpy(&x, &u, 4);
    uint16_t got = tt_float_to_f16(x), want = f16_reference(x);
    cr_assert_eq(got, want, "f32 %08x (%a): %04x, want %04x", u, x, got, want);
  }
  for (uint32_t h = 0; h < 0x7bff; h++) {   /* the midpoints and their f32 neighbours */
    double mid = 0.5 * ((double)tt_f16_to_float((uint16_t)h) +
                        (double)tt_f16_to_float((uint16_t)(h + 1)));
    float m = (float)mid;   /* exact: a half's midpoint has 12 significant bits */
    float near[3] = {nextafterf(m, 0.0f), m, nextafterf(m, INFINITY)};
    for (int k = 0; k < 3; k++) {
      cr_assert_eq(tt_float_to_f16(near[k]), f16_reference(near[k]), "%a", near[k]);
      cr_assert_eq(tt_float_to_f16(-near[k]), f16_reference(-near[k]), "%a", -near[k]);
    }
  }
}

/* float64 reference for fp8: the nearest representable value, ties to even code. */
static float fp8_reference(float x, int dtype) {
  float best = 0.0f;
  int best_code = -1;
  for (int c = 0; c < 256; c++) {
    float v = tt_fp8_to_float((uint8_t)c, dtype);
    if (!isfinite(v)) continue;
    double d = fabs((double)v - x), bd = fabs((double)best - x);
    if (best_code < 0 || d < bd || (d == bd && (c & 1) == 0 && (best_code & 1))) {
      best = v;
      best_code = c;
    }
  }
  return best;
}

Test(cast, fp8_formats) {
  cr_assert_eq(tt_fp8_to_float(0x7e, TT_E4M3), 448.0f);
  cr_assert(isnan(tt_fp8_to_float(0x7f, TT_E4M3)));
  cr_assert_eq(tt_fp8_to_float(0x7b, TT_E5M2), 57344.0f);
  cr_assert(isinf(tt_fp8_to_float(0x7c, TT_E5M2)));
  cr_assert_eq(tt_fp8_to_float(0x01, TT_E4M3), 0x1p-9f);
  cr_assert_eq(tt_fp8_to_float(0x01, TT_E5M2), 0x1p-16f);
  /* Saturation instead of overflow, for both signs and for infinities. */
  cr_assert_eq(tt_fp8_to_float(tt_float_to_fp8(1e6f, TT_E4M3), TT_E4M3), 448.0f);
  cr_assert_eq(tt_fp8_to_float(tt_float_to_fp8(-INFINITY, TT_E4M3), TT_E4M3), -448.0f);
  cr_assert_eq(tt_fp8_to_float(tt_float_to_fp8(1e9f, TT_E5M2), TT_E5M2), 57344.0f);
  cr_assert(isnan(tt_fp8_to_float(tt_float_to_fp8(NAN, TT_E4M3), TT_E4M3)));
  cr_assert(isnan(tt_fp8_to_float(tt_float_to_fp8(NAN, TT_E5M2), TT_E5M2)));
  /* Every code round-trips; random values round to the nearest code. */
  int dts[2] = {TT_E4M3, TT_E5M2};
  for (int k = 0; k < 2; k++) {
    for (int c = 0; c < 256; c++) {
      float v = tt_fp8_to_float((uint8_t)c, dts[k]);
      if (!isfinite(v) || (v == 0.0f && c == 0x80)) continue;
      cr_assert_eq(tt_float_to_fp8(v, dts[k]), c, "fp8 %s code %02x", tt_dtype_name(dts[k]), c);
    }
    uint64_t seed = 7;
    for (int i = 0; i < 20000; i++) {
      float x = (float)(tt_test_uniform(&seed) * (k ? 60000.0 : 460.0));
      if (i % 3 == 0) x *= 1e-3f;
      float got = tt_fp8_to_float(tt_float_to_fp8(x, dts[k]), dts[k]);
      cr_assert_eq(got, fp8_reference(x, dts[k]), "%s of %.9g", tt_dtype_name(dts[k]), x);
    }
  }
}

/* The copies around a bf16 GEMM take a row loop of their own (copy_row_fast): it must
** round every value as tt_float_to_bf16 does, ties, NaN, infinities and signed zeros
** included, in contiguous rows and through a transposed view, and bf16 rows copy as they
** are. */
Test(cast, bf16_copy_rows_round_as_the_element_function) {
  float vals[24] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, NAN,
                    -NAN, INFINITY, -INFINITY, 3.4e38f, -0.0f, 0.0f, 0x1p-130f, -1.5f,
                    65504.0f, 1e-3f, -7.0f / 3, 0.1f, 2.5f, -2.5f, 1e30f, -1e-30f,
                    1.0f - 0x1p-9f, 255.5f, 0x1.fffffep127f, 3.0f};
  int64_t shape[2] = {4, 6}, tshape[2] = {6, 4};
  tt_tensor *x = NULL, *b = NULL, *xt = NULL, *bt = NULL, *back = NULL, *bb = NULL;
  cr_assert(tt_tensor_from_buffer(vals, shape, 2, TT_F32, &x) == 0);
  cr_assert(tt_tensor_empty(shape, 2, TT_BF16, TT_CPU, &b) == 0 && tt_copy_(b, x) == 0);
  cr_assert(tt_transpose(x, 0, 1, &xt) == 0);
  cr_assert(tt_tensor_empty(tshape, 2, TT_BF16, TT_CPU, &bt) == 0 && tt_copy_(bt, xt) == 0);
  cr_assert(tt_tensor_empty(shape, 2, TT_F32, TT_CPU, &back) == 0 && tt_copy_(back, b) == 0);
  const uint16_t *hb = tt_tensor_data(b), *hbt = tt_tensor_data(bt);
  const float *fb = tt_tensor_data(back);
  for (int i = 0; i < 24; i++) {
    uint16_t want = tt_float_to_bf16(vals[i]);
    cr_assert_eq(hb[i], want, "element %d (%a): %04x, want %04x", i, vals[i], hb[i], want);
    int r = i / 6, c = i % 6;
    cr_assert_eq(hbt[c * 4 + r], want, "transposed element %d", i);
    uint32_t got_bits, want_bits;
    float wf = tt_bf16_to_float(want);
    memcpy(&got_bits, &fb[i], 4);
    memcpy(&want_bits, &wf, 4);
    cr_assert_eq(got_bits, want_bits, "element %d back to f32", i);
  }
  /* bf16 to bf16 from the transposed view: the same patterns, moved. */
  tt_tensor *btt = NULL;
  cr_assert(tt_transpose(bt, 0, 1, &btt) == 0);
  cr_assert(tt_tensor_empty(shape, 2, TT_BF16, TT_CPU, &bb) == 0 && tt_copy_(bb, btt) == 0);
  cr_assert(memcmp(tt_tensor_data(bb), hb, 24 * sizeof(uint16_t)) == 0);
  tt_tensor *all[] = {x, b, xt, bt, back, bb, btt};
  for (int i = 0; i < 7; i++) tt_tensor_release(all[i]);
}

Test(cast, tensor_cast_strided) {
  int64_t shape[2] = {7, 5};
  tt_tensor *x = tt_test_rand_strided(shape, 2, 3), *b = NULL, *back = NULL;
  cr_assert(tt_cast(x, TT_BF16, &b) == 0, "%s", tt_last_error());
  cr_assert(tt_cast(b, TT_F32, &back) == 0);
  for (int i = 0; i < 35; i++) {
    double v = tt_tensor_get(x, i);
    cr_assert_eq(tt_tensor_get(back, i), tt_bf16_to_float(tt_float_to_bf16((float)v)));
    cr_assert(fabs(tt_tensor_get(back, i) - v) <= fabs(v) * 0x1p-8);
  }
  tt_tensor_release(x);
  tt_tensor_release(b);
  tt_tensor_release(back);
}

/* -- Allocator ----------------------------------------------------------------------- */

Test(alloc, live_peak_and_cache) {
  tt_alloc_stats s0, s1, s2, s3;
  tt_alloc_empty_cache(TT_CPU);
  tt_alloc_reset_peak(TT_CPU);
  cr_assert(tt_alloc_stats_get(TT_CPU, &s0) == 0);
  int64_t shape[1] = {1000};   /* 4000 bytes -> size class 4096 */
  tt_tensor *a = NULL, *b = NULL;
  cr_assert(tt_tensor_empty(shape, 1, TT_F32, TT_CPU, &a) == 0);
  cr_assert(tt_alloc_stats_get(TT_CPU, &s1) == 0);
  cr_assert_eq(s1.live_bytes - s0.live_bytes, 4096);
  cr_assert_geq(s1.peak_bytes, s1.live_bytes);
  void *first = tt_tensor_data(a);
  tt_tensor_release(a);
  cr_assert(tt_alloc_stats_get(TT_CPU, &s2) == 0);
  cr_assert_eq(s2.live_bytes, s0.live_bytes);
  cr_assert_eq(s2.cached_bytes - s0.cached_bytes, 4096);
  cr_assert_eq(s2.peak_bytes, s1.peak_bytes);   /* peak stays */
  /* Same size class again: served from the cache, same block. */
  cr_assert(tt_tensor_empty(shape, 1, TT_F32, TT_CPU, &b) == 0);
  cr_assert(tt_alloc_stats_get(TT_CPU, &s3) == 0);
  cr_assert_eq(tt_tensor_data(b), first);
  cr_assert_eq(s3.num_cache_hits - s2.num_cache_hits, 1);
  tt_tensor_release(b);
  tt_alloc_empty_cache(TT_CPU);
  cr_assert(tt_alloc_stats_get(TT_CPU, &s3) == 0);
  cr_assert_eq(s3.cached_bytes, 0);
}

/* Granted sizes: 4 classes a power of two below 16 MiB (at most 25% over the request),
** 32 from 16 MiB on (at most 1/32 over); every class boundary where the two meet rounds
** the same way; a request of a class's exact size is granted that size. */
Test(alloc, size_classes) {
  const size_t mib = (size_t)1 << 20;
  cr_assert_eq(tt_alloc_granted_bytes(1000), 1024);
  cr_assert_eq(tt_alloc_granted_bytes(1025), 1280);
  cr_assert_eq(tt_alloc_granted_bytes(13 * mib), 14 * mib);   /* 12, 14, 16 MiB */
  cr_assert_eq(tt_alloc_granted_bytes(16 * mib - 1), 16 * mib);
  cr_assert_eq(tt_alloc_granted_bytes(16 * mib), 16 * mib);
  cr_assert_eq(tt_alloc_granted_bytes(16 * mib + 1), 16 * mib + 512 * 1024);
  /* the 408 MiB ZeRO-3 share of Llama-3 70B at tp 4 x dp 2: 416 MiB (448 with 4 classes) */
  cr_assert_eq(tt_alloc_granted_bytes(427851776), 416 * mib);
  for (size_t n = 64; n < ((size_t)1 << 36); n = n * 5 / 4 + 12345) {
    size_t g = tt_alloc_granted_bytes(n);
    cr_assert_geq(g, n);
    cr_assert_eq(tt_alloc_granted_bytes(g), g, "%zu: granted %zu, then %zu", n, g,
                 tt_alloc_granted_bytes(g));
    cr_assert_leq((double)(g - n), (n >= 16 * mib ? n / 32.0 : n / 4.0) + 64,
                  "%zu bytes granted %zu", n, g);
  }
}

/* A large block (past 16 MiB, in the fine classes) goes back to the cache and serves the
** next request of its class. */
Test(alloc, large_block_cached) {
  tt_alloc_stats s0, s1;
  tt_alloc_empty_cache(TT_CPU);
  int64_t shape[1] = {5 * 1000 * 1000 + 7};   /* 20 MB of f32: class 19.5 MiB */
  tt_tensor *a = NULL, *b = NULL;
  cr_assert(tt_tensor_empty(shape, 1, TT_F32, TT_CPU, &a) == 0);
  void *first = tt_tensor_data(a);
  tt_tensor_release(a);
  cr_assert(tt_alloc_stats_get(TT_CPU, &s0) == 0);
  cr_assert_eq(s0.cached_bytes, (int64_t)tt_alloc_granted_bytes((size_t)shape[0] * 4));
  cr_assert_eq(s0.cached_bytes, 39 * (1 << 19));
  cr_assert(tt_tensor_empty(shape, 1, TT_F32, TT_CPU, &b) == 0);
  cr_assert(tt_alloc_stats_get(TT_CPU, &s1) == 0);
  cr_assert_eq(tt_tensor_data(b), first);
  cr_assert_eq(s1.num_cache_hits - s0.num_cache_hits, 1);
  tt_tensor_release(b);
  tt_alloc_empty_cache(TT_CPU);
}

Test(alloc, views_keep_storage_alive) {
  tt_tensor *t = arange_f32(10), *v = NULL;
  cr_assert(tt_narrow(t, 0, 2, 3, &v) == 0);
  tt_tensor_release(t);   /* the view still holds the storage */
  cr_assert_eq(tt_tensor_get(v, 0), 2.0);
  tt_tensor_release(v);
}

Test(rng, seeded_and_restorable) {
  int64_t shape[1] = {1001};
  tt_tensor *a = NULL, *b = NULL, *c = NULL;
  tt_manual_seed(42);
  cr_assert(tt_tensor_randn(shape, 1, 0.0, 1.0, &a) == 0);
  uint64_t state = tt_rng_state();
  cr_assert(tt_tensor_randn(shape, 1, 0.0, 1.0, &b) == 0);
  tt_rng_set_state(state);
  cr_assert(tt_tensor_randn(shape, 1, 0.0, 1.0, &c) == 0);
  double mean = 0, var = 0;
  for (int i = 0; i < 1001; i++) {
    cr_assert_eq(tt_tensor_get(b, i), tt_tensor_get(c, i));
    mean += tt_tensor_get(a, i) / 1001.0;
  }
  for (int i = 0; i < 1001; i++) var += pow(tt_tensor_get(a, i) - mean, 2) / 1000.0;
  cr_assert(fabs(mean) < 0.1 && fabs(var - 1.0) < 0.15, "mean %g var %g", mean, var);
  tt_tensor_release(a);
  tt_tensor_release(b);
  tt_tensor_release(c);
}

/* splitmix64 and Box-Muller written out here, one draw after another: the model the
** engine's threaded draws must reproduce bit for bit. */
static uint64_t ref_state;
static double ref_unit(void) {
  uint64_t z = (ref_state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return ((double)(z >> 11) + 0.5) * 0x1.0p-53;
}

/* One large draw (many threads, each from its own position in the stream) gives the
** values of the serial model, and leaves the state of the same draws made serially in
** small pieces (even sizes for normals: each pair of outputs takes two draws). */
static void expect_same_as_pieces(int normal) {
  enum { N = 1 << 18, PIECE = 1000 };
  int64_t n = N, piece = PIECE;
  tt_tensor *big = NULL, *part = NULL, *after_big = NULL, *after_parts = NULL;
  int64_t one = 1;
  tt_manual_seed(9);
  ref_state = tt_rng_state();
  cr_assert_eq(normal ? tt_tensor_randn(&n, 1, 0.5, 2.0, &big)
                      : tt_tensor_rand(&n, 1, -1.0, 3.0, &big), 0);
  cr_assert_eq(tt_tensor_randn(&one, 1, 0.0, 1.0, &after_big), 0);
  const float *bv = tt_tensor_data(big);
  for (int64_t i = 0; i < N; i += normal ? 2 : 1) {
    float want[2];
    if (normal) {
      double r = sqrt(-2.0 * log(ref_unit())), a = 2.0 * M_PI * ref_unit();
      want[0] = (float)(0.5 + 2.0 * r * cos(a));
      want[1] = (float)(0.5 + 2.0 * r * sin(a));
    } else {
      want[0] = (float)(-1.0 + 4.0 * ref_unit());
    }
    for (int j = 0; j < (normal ? 2 : 1); j++)
      cr_assert_eq(memcmp(&bv[i + j], &want[j], sizeof(float)), 0,
                   "element %lld: %.9g, the serial model %.9g", (long long)(i + j), bv[i + j],
                   want[j]);
  }
  tt_manual_seed(9);
  const float *b = tt_tensor_data(big);
  for (int64_t at = 0; at < N; at += PIECE) {
    piece = N - at < PIECE ? N - at : PIECE;
    cr_assert_eq(normal ? tt_tensor_randn(&piece, 1, 0.5, 2.0, &part)
                        : tt_tensor_rand(&piece, 1, -1.0, 3.0, &part), 0);
    const float *p = tt_tensor_data(part);
    for (int64_t i = 0; i < piece; i++)
      cr_assert_eq(memcmp(&p[i], &b[at + i], sizeof(float)), 0, "element %lld: %.9g vs %.9g",
                   (long long)(at + i), p[i], b[at + i]);
    tt_tensor_release(part);
  }
  cr_assert_eq(tt_tensor_randn(&one, 1, 0.0, 1.0, &after_parts), 0);
  cr_assert_eq(tt_tensor_get(after_big, 0), tt_tensor_get(after_parts, 0),
               "the stream's state after the draws differs");
  tt_tensor_release(big);
  tt_tensor_release(after_big);
  tt_tensor_release(after_parts);
}

Test(rng, parallel_normals_equal_serial_pieces) { expect_same_as_pieces(1); }
Test(rng, parallel_uniforms_equal_serial_pieces) { expect_same_as_pieces(0); }

/* A lazy draw (tetra.h) takes no memory; a copy of a view of it (rows, strided columns,
** a transpose, a view of a view) holds the bits of the eager draw from the same state at
** the same places, and leaves it lazy; reading it draws it whole, equal to the eager one;
** the generator ends where the eager draw leaves it. Lazy zeros likewise. */
static void expect_lazy_views_like_eager(int normal) {
  const int64_t shape[2] = {7, 9};
  tt_tensor *lazy = NULL, *eager = NULL, *after_lazy = NULL, *after_eager = NULL;
  int64_t one = 1;
  tt_alloc_stats st;
  tt_manual_seed(21);
  uint64_t state = tt_rng_state();
  tt_alloc_stats_get(TT_CPU, &st);
  int64_t live = st.live_bytes;
  cr_assert_eq(normal ? tt_tensor_randn(shape, 2, 0.25, 3.0, &lazy)
                      : tt_tensor_rand(shape, 2, -2.0, 5.0, &lazy), 0);
  cr_assert_eq(tt_tensor_randn(&one, 1, 0.0, 1.0, &after_lazy), 0);
  tt_alloc_stats_get(TT_CPU, &st);
  cr_assert_eq(st.live_bytes, live, "a lazy draw took %lld bytes",
               (long long)(st.live_bytes - live));
  cr_assert(tt_tensor_is_lazy(lazy));
  int was = tt_set_lazy_init(0);
  tt_rng_set_state(state);
  cr_assert_eq(normal ? tt_tensor_randn(shape, 2, 0.25, 3.0, &eager)
                      : tt_tensor_rand(shape, 2, -2.0, 5.0, &eager), 0);
  cr_assert_eq(tt_tensor_randn(&one, 1, 0.0, 1.0, &after_eager), 0);
  tt_set_lazy_init(was);
  cr_assert(!tt_tensor_is_lazy(eager));
  cr_assert_eq(tt_tensor_get(after_lazy, 0), tt_tensor_get(after_eager, 0),
               "the generator's state after the draw differs");
  const float *e = tt_tensor_data(eager);
  /* views: {dim, start, length} narrows, then an optional transpose */
  const struct { int dim; int64_t start, len; int dim2; int64_t start2, len2; int tr; } views[] = {
      {0, 2, 3, -1, 0, 0, 0}, {1, 3, 5, -1, 0, 0, 0}, {0, 0, 7, -1, 0, 0, 1},
      {1, 1, 7, 0, 4, 3, 0},  {0, 6, 1, 1, 8, 1, 0},  {1, 0, 9, -1, 0, 0, 0}};
  for (size_t k = 0; k < sizeof views / sizeof views[0]; k++) {
    tt_tensor *v = NULL, *w = NULL, *c = NULL;
    cr_assert_eq(tt_narrow(lazy, views[k].dim, views[k].start, views[k].len, &v), 0);
    if (views[k].dim2 >= 0) {
      cr_assert_eq(tt_narrow(v, views[k].dim2, views[k].start2, views[k].len2, &w), 0);
      tt_tensor_release(v);
      v = w;
    }
    if (views[k].tr) {
      cr_assert_eq(tt_transpose(v, 0, 1, &w), 0);
      tt_tensor_release(v);
      v = w;
    }
    cr_assert_eq(tt_clone(v, &c), 0, "%s", tt_last_error());
    for (int64_t i = 0; i < c->shape[0]; i++)
      for (int64_t j = 0; j < c->shape[1]; j++) {
        int64_t at = v->offset + i * v->stride[0] + j * v->stride[1];
        float got = (float)tt_tensor_get(c, i * c->shape[1] + j);
        cr_assert_eq(memcmp(&got, &e[at], sizeof got), 0, "view %zu (%lld, %lld): %.9g, the "
                     "eager draw %.9g", k, (long long)i, (long long)j, got, e[at]);
      }
    cr_assert(tt_tensor_is_lazy(lazy), "copying view %zu drew the whole tensor", k);
    tt_tensor_release(v);
    tt_tensor_release(c);
  }
  const float *l = tt_tensor_data(lazy);   /* drawn whole now */
  cr_assert(!tt_tensor_is_lazy(lazy));
  cr_assert_eq(memcmp(l, e, sizeof(float) * 63), 0, "the whole lazy draw differs");
  tt_tensor_release(lazy);
  tt_tensor_release(eager);
  tt_tensor_release(after_lazy);
  tt_tensor_release(after_eager);
}

Test(rng, lazy_normals_equal_eager_ones_view_by_view) { expect_lazy_views_like_eager(1); }
Test(rng, lazy_uniforms_equal_eager_ones_view_by_view) { expect_lazy_views_like_eager(0); }

/* Views large enough for the threads (kernel.h's grain is 32768 elements), copied into
** bf16 so that the view's own draw runs (an f32 run is drawn straight into its copy):
** a ZeRO-3 share, one long row of a flat view at an odd offset (fewer rows than threads:
** each row by lazy_fill's threads), and a row-parallel slice, many short rows (a row a
** thread). Each must round to the eager draw's bf16 values, bit for bit. */
Test(rng, lazy_large_views_equal_eager_ones) {
  const int64_t shape[2] = {300, 1001}, flat = 300 * 1001;
  tt_manual_seed(5);
  uint64_t state = tt_rng_state();
  tt_tensor *lazy = NULL, *eager = NULL;
  cr_assert_eq(tt_tensor_randn(shape, 2, 0.0, 0.02, &lazy), 0);
  int was = tt_set_lazy_init(0);
  tt_rng_set_state(state);
  cr_assert_eq(tt_tensor_randn(shape, 2, 0.0, 0.02, &eager), 0);
  tt_set_lazy_init(was);
  for (int k = 0; k < 2; k++) {
    tt_tensor *src[2] = {lazy, eager}, *got[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
      tt_tensor *f = NULL, *v = NULL;
      if (k == 0) {   /* a share: elements [1001 * 37 + 1, + 150001) of the flat view */
        cr_assert_eq(tt_view(src[i], &flat, 1, &f), 0);
        cr_assert_eq(tt_narrow(f, 0, 1001 * 37 + 1, 150001, &v), 0);
      } else {   /* a slice: columns [250, 750) of every row */
        cr_assert_eq(tt_narrow(src[i], 1, 250, 500, &v), 0);
      }
      cr_assert_eq(tt_tensor_empty(v->shape, v->ndim, TT_BF16, TT_CPU, &got[i]), 0);
      cr_assert_eq(tt_copy_(got[i], v), 0, "%s", tt_last_error());
      tt_tensor_release(v);
      tt_tensor_release(f);
    }
    cr_assert(tt_tensor_is_lazy(lazy), "copying view %d drew the whole tensor", k);
    int64_t n = tt_tensor_numel(got[0]);
    cr_assert_gt(n, 32768);
    cr_assert_eq(memcmp(tt_tensor_data(got[0]), tt_tensor_data(got[1]), (size_t)n * 2), 0,
                 "view %d of the lazy draw differs from the eager one's", k);
    tt_tensor_release(got[0]);
    tt_tensor_release(got[1]);
  }
  tt_tensor_release(lazy);
  tt_tensor_release(eager);
}

Test(rng, lazy_zeros_take_memory_at_first_use) {
  const int64_t shape[2] = {5, 6};
  tt_alloc_stats st;
  tt_alloc_stats_get(TT_CPU, &st);
  int64_t live = st.live_bytes;
  tt_tensor *z = NULL, *part = NULL, *c = NULL;
  cr_assert_eq(tt_tensor_lazy_zeros(shape, 2, TT_CPU, &z), 0);
  cr_assert(tt_tensor_is_lazy(z));
  cr_assert_eq(tt_narrow(z, 1, 2, 3, &part), 0);
  cr_assert_eq(tt_clone(part, &c), 0);
  for (int i = 0; i < 15; i++) cr_assert_eq(tt_tensor_get(c, i), 0.0);
  tt_alloc_stats_get(TT_CPU, &st);
  int64_t taken = st.live_bytes - live;
  tt_tensor *same = NULL;   /* what a tensor of the copy's size takes (sizes are rounded) */
  cr_assert_eq(tt_tensor_empty(part->shape, 2, TT_F32, TT_CPU, &same), 0);
  tt_alloc_stats_get(TT_CPU, &st);
  cr_assert_eq(taken, st.live_bytes - live - taken, "the lazy zeros took memory");
  tt_tensor_release(same);
  cr_assert_eq(tt_tensor_materialize(z), 0);
  cr_assert(!tt_tensor_is_lazy(z));
  for (int i = 0; i < 30; i++) cr_assert_eq(tt_tensor_get(z, i), 0.0);
  tt_tensor_release(part);
  tt_tensor_release(c);
  tt_tensor_release(z);
}

/* A strided copy of one dtype moves bits: int64 ids above 2^53, which a double cannot
** hold, stay exact through a transpose (the CUDA twin: cuda/test_runtime). */
Test(tensor, strided_int64_copy_is_exact) {
  const int64_t shape[2] = {3, 8};
  tt_tensor *h = NULL, *tr = NULL, *got = NULL;
  cr_assert(tt_tensor_empty(shape, 2, TT_I64, TT_CPU, &h) == 0);
  int64_t *p = tt_tensor_data(h);
  for (int64_t i = 0; i < 24; i++) p[i] = ((int64_t)1 << 60) + 2 * i + 1;
  cr_assert(tt_transpose(h, 0, 1, &tr) == 0);
  cr_assert(tt_contiguous(tr, &got) == 0, "%s", tt_last_error());
  const int64_t *q = tt_tensor_data(got);
  for (int64_t r = 0; r < 8; r++)
    for (int64_t c = 0; c < 3; c++)
      cr_assert_eq(q[r * 3 + c], p[c * 8 + r], "[%lld, %lld]: %lld, want %lld", (long long)r,
                   (long long)c, (long long)q[r * 3 + c], (long long)p[c * 8 + r]);
  tt_tensor_release(got);
  tt_tensor_release(tr);
  tt_tensor_release(h);
}

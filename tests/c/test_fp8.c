/*
** test_fp8.c — FP8 scaling on CPU: delayed-scaling history, quantise / dequantise against
** a per-element reference, and the FP8 linear op (forward and backward) against a float64
** computation on the same quantised operands.
*/
#include <criterion/criterion.h>
#include <math.h>
#include "tt_internal.h"
#include "tetra_amp.h"

static tt_tensor *randn(int64_t *shape, int ndim, double std) {
  tt_tensor *t = NULL;
  cr_assert_eq(tt_tensor_randn(shape, ndim, 0.0, std, &t), 0, "%s", tt_last_error());
  return t;
}

static double *values(const tt_tensor *t) {
  double *v = malloc(sizeof(double) * (size_t)tt_tensor_numel(t));
  cr_assert_not_null(v);
  cr_assert_eq(tt_tensor_to_f64(t, v), 0, "%s", tt_last_error());
  return v;
}

/* The value x takes after a round trip through fp8 at `scale`. */
static double fake_ref(double x, int dtype, double scale) {
  return tt_fp8_to_float(tt_float_to_fp8((float)(x * scale), dtype), dtype) / scale;
}

Test(fp8, delayed_scaling_history) {
  tt_fp8_meta m;
  cr_assert_eq(tt_fp8_meta_init(&m, TT_E4M3, 3, 1), 0);
  cr_assert_eq(m.scale, 1.0);
  tt_fp8_meta_update(&m, 2.0);
  cr_assert_float_eq(m.scale, 448.0 / 2.0 / 2.0, 1e-12);
  tt_fp8_meta_update(&m, 8.0);
  tt_fp8_meta_update(&m, 1.0);
  cr_assert_float_eq(m.scale, 448.0 / 8.0 / 2.0, 1e-12);
  tt_fp8_meta_update(&m, 0.0);          /* ignored */
  tt_fp8_meta_update(&m, INFINITY);     /* ignored */
  cr_assert_eq(m.filled, 3);
  tt_fp8_meta_update(&m, 1.0);          /* drops 2 */
  tt_fp8_meta_update(&m, 1.0);          /* drops 8: the max falls out of the window */
  cr_assert_float_eq(m.scale, 448.0 / 1.0 / 2.0, 1e-12);
  cr_assert_eq(tt_fp8_meta_init(&m, TT_E5M2, 0, 0), 0);
  cr_assert_eq(m.history_len, 16);
  tt_fp8_meta_update(&m, 4.0);
  cr_assert_float_eq(m.scale, 57344.0 / 4.0, 1e-9);
  cr_assert_eq(tt_fp8_meta_init(&m, TT_F32, 4, 0), -1);
}

Test(fp8, quantize_dequantize_match_reference) {
  int64_t shape[2] = {37, 53};
  const int dtypes[2] = {TT_E4M3, TT_E5M2};
  for (int k = 0; k < 2; k++) {
    int dt = dtypes[k];
    tt_tensor *x = randn(shape, 2, 3.0);
    double *xv = values(x);
    double amax_ref = 0;
    for (int64_t i = 0; i < 37 * 53; i++) amax_ref = fmax(amax_ref, fabs(xv[i]));
    double scale = tt_fp8_max(dt) / amax_ref;
    tt_tensor *q = NULL, *d = NULL, *f = NULL;
    double amax = 0, amax2 = 0;
    cr_assert_eq(tt_fp8_quantize(x, dt, scale, &q, &amax), 0, "%s", tt_last_error());
    cr_assert_eq(q->dtype, dt);
    cr_assert_float_eq(amax, amax_ref, 1e-6 * amax_ref);
    cr_assert_eq(tt_fp8_dequantize(q, scale, &d), 0, "%s", tt_last_error());
    cr_assert_eq(tt_fp8_fake_quantize(x, dt, scale, &f, &amax2), 0, "%s", tt_last_error());
    cr_assert_eq(amax2, amax);
    double *dv = values(d), *fv = values(f);
    /* Relative rounding error of a normal fp8 value: half an ulp, 2^-4 (e4m3) or 2^-3
    ** (e5m2); the subnormal tail is bounded by half the smallest step instead. */
    double rel = dt == TT_E4M3 ? 0.0625 : 0.125;
    double tiny = (dt == TT_E4M3 ? ldexp(1.0, -10) : ldexp(1.0, -17)) / scale;
    for (int64_t i = 0; i < 37 * 53; i++) {
      double want = fake_ref(xv[i], dt, scale);
      cr_assert_float_eq(dv[i], want, 1e-6 * fabs(want) + 1e-30, "elem %lld", (long long)i);
      cr_assert_eq(fv[i], dv[i], "fake quantise differs from quantise+dequantise");
      cr_assert(fabs(dv[i] - xv[i]) <= rel * fabs(xv[i]) + tiny, "elem %lld: %g vs %g",
                (long long)i, dv[i], xv[i]);
    }
    free(xv);
    free(dv);
    free(fv);
    tt_tensor_release(x);
    tt_tensor_release(q);
    tt_tensor_release(d);
    tt_tensor_release(f);
  }
}

Test(fp8, quantize_saturates_and_reports_nan) {
  double v[4] = {1000.0, -1e6, 0.5, NAN};
  int64_t n = 4;
  tt_tensor *x = NULL, *f = NULL;
  cr_assert_eq(tt_tensor_from_f64(v, &n, 1, TT_F32, &x), 0);
  double amax = 0;
  cr_assert_eq(tt_fp8_fake_quantize(x, TT_E4M3, 1.0, &f, &amax), 0, "%s", tt_last_error());
  cr_assert(isnan(amax));
  cr_assert_eq(tt_tensor_get(f, 0), 448.0);
  cr_assert_eq(tt_tensor_get(f, 1), -448.0);
  cr_assert_eq(tt_tensor_get(f, 2), 0.5);
  tt_tensor_release(x);
  tt_tensor_release(f);
}

/* out[r, o] = sum_i a[r, i] * b[o, i] (+ bias[o]) in float64. */
static void linear_ref(const double *a, const double *b, const double *bias, int rows,
                       int in, int outf, double *out) {
  for (int r = 0; r < rows; r++)
    for (int o = 0; o < outf; o++) {
      double s = bias ? bias[o] : 0;
      for (int i = 0; i < in; i++) s += a[r * in + i] * b[o * in + i];
      out[r * outf + o] = s;
    }
}

static double max_abs_diff(const double *a, const double *b, int64_t n, double *ref_max) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; i++) {
    d = fmax(d, fabs(a[i] - b[i]));
    m = fmax(m, fabs(b[i]));
  }
  *ref_max = m;
  return d;
}

Test(fp8, linear_forward_backward) {
  enum { B = 3, T = 5, IN = 24, OUT = 13, ROWS = B * T };
  tt_manual_seed(7);
  int64_t xs[3] = {B, T, IN}, ws[2] = {OUT, IN}, bs[1] = {OUT}, ys[3] = {B, T, OUT};
  tt_tensor *x = randn(xs, 3, 1.0), *w = randn(ws, 2, 0.2), *b = randn(bs, 1, 0.1);
  tt_tensor *gy = randn(ys, 3, 1e-3);
  cr_assert_eq(tt_set_requires_grad(x, 1), 0);
  cr_assert_eq(tt_set_requires_grad(w, 1), 0);
  cr_assert_eq(tt_set_requires_grad(b, 1), 0);
  tt_fp8_linear_state st;
  cr_assert_eq(tt_fp8_linear_state_init(&st, 4, 0), 0);
  tt_tensor *y = NULL;
  cr_assert_eq(tt_fp8_linear(x, w, b, &st, &y), 0, "%s", tt_last_error());
  cr_assert_eq(y->ndim, 3);
  cr_assert_eq(y->shape[2], OUT);

  double *xv = values(x), *wv = values(w), *bv = values(b), *gv = values(gy);
  double xa = 0, wa = 0, ga = 0;
  for (int i = 0; i < ROWS * IN; i++) xa = fmax(xa, fabs(xv[i]));
  for (int i = 0; i < OUT * IN; i++) wa = fmax(wa, fabs(wv[i]));
  for (int i = 0; i < ROWS * OUT; i++) ga = fmax(ga, fabs(gv[i]));
  /* First use of each meta: the scale comes from the tensor's own amax. */
  cr_assert_float_eq(st.x.scale, 448.0 / xa, 1e-5 * 448.0 / xa);
  cr_assert_float_eq(st.w.scale, 448.0 / wa, 1e-5 * 448.0 / wa);
  double xq[ROWS * IN], wq[OUT * IN], gq[ROWS * OUT];
  for (int i = 0; i < ROWS * IN; i++) xq[i] = fake_ref(xv[i], TT_E4M3, st.x.scale);
  for (int i = 0; i < OUT * IN; i++) wq[i] = fake_ref(wv[i], TT_E4M3, st.w.scale);

  double yref[ROWS * OUT], m;
  linear_ref(xq, wq, bv, ROWS, IN, OUT, yref);
  double *yv = values(y);
  cr_assert(max_abs_diff(yv, yref, ROWS * OUT, &m) <= 1e-5 * m);
  /* And against the unquantised layer: FP8 rounding only, a few percent. */
  double yfull[ROWS * OUT];
  linear_ref(xv, wv, bv, ROWS, IN, OUT, yfull);
  cr_assert(max_abs_diff(yv, yfull, ROWS * OUT, &m) <= 0.1 * m);

  cr_assert_eq(tt_backward_with(y, gy), 0, "%s", tt_last_error());
  cr_assert_float_eq(st.g.scale, 57344.0 / ga, 1e-5 * 57344.0 / ga);
  for (int i = 0; i < ROWS * OUT; i++) gq[i] = fake_ref(gv[i], TT_E5M2, st.g.scale);
  double dx[ROWS * IN], dw[OUT * IN], db[OUT];
  for (int r = 0; r < ROWS; r++)
    for (int i = 0; i < IN; i++) {
      double s = 0;
      for (int o = 0; o < OUT; o++) s += gq[r * OUT + o] * wq[o * IN + i];
      dx[r * IN + i] = s;
    }
  for (int o = 0; o < OUT; o++) {
    db[o] = 0;
    for (int r = 0; r < ROWS; r++) db[o] += gv[r * OUT + o];
    for (int i = 0; i < IN; i++) {
      double s = 0;
      for (int r = 0; r < ROWS; r++) s += gq[r * OUT + o] * xq[r * IN + i];
      dw[o * IN + i] = s;
    }
  }
  double *dxv = values(x->grad), *dwv = values(w->grad), *dbv = values(b->grad);
  cr_assert(max_abs_diff(dxv, dx, ROWS * IN, &m) <= 1e-5 * m, "dx");
  cr_assert(max_abs_diff(dwv, dw, OUT * IN, &m) <= 1e-5 * m, "dw");
  cr_assert(max_abs_diff(dbv, db, OUT, &m) <= 1e-5 * m, "db");

  /* A second forward uses the delayed scale: the history max, not the new tensor's. */
  tt_tensor *x2 = NULL, *y2 = NULL;
  cr_assert_eq(tt_scale(x, 0.5, &x2), 0);
  double scale_before = st.x.scale;
  cr_assert_eq(tt_fp8_linear(x2, w, b, &st, &y2), 0, "%s", tt_last_error());
  cr_assert_float_eq(st.x.scale, scale_before, 1e-12 * scale_before);
  cr_assert_eq(st.x.filled, 2);
  tt_tape_clear();

  free(xv); free(wv); free(bv); free(gv); free(yv); free(dxv); free(dwv); free(dbv);
  tt_tensor_release(x); tt_tensor_release(w); tt_tensor_release(b); tt_tensor_release(gy);
  tt_tensor_release(y); tt_tensor_release(x2); tt_tensor_release(y2);
}

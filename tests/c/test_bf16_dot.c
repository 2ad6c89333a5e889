/*
** test_bf16_dot.c — bf16 products on the CPU's dot-product instructions
** (TETRA_BF16_GEMM=dot: oneDNN's gemm_bf16bf16f32, kernels/cpu/blas.c) against the
** emulation they stand in for (f32 products of the bf16-rounded values) and against a
** float64 sum of the same rounded operands: tt_linear_lowp_ex's output (f32 and bf16) and
** its x, w and bias gradients, and the grouped q|k|v GEMM (tt_linear_lowp_group) forward
** and backward. Both ways sum exact products (a bf16 times a bf16 fits an f32) in f32, in
** each library's own order, so they agree to f32 rounding of the sums, far inside bf16's
** own error. Also: the products really ran on oneDNN (tt_blas_calls("bf16-dot")), a second
** run gives the same bits, and the choice refuses unknown names and CPUs without the
** instructions. oneDNN is installed by tools/setup; without it this fails under CI=true.
*/
#include "tt_test.h"
#include "tt_skip_main.h"

enum { ROWS = 2 * 37, IN = 96, OUT = 80 };

/* v rounded to bf16 (nearest, ties to even), as a double. */
static double bf16r(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float r;
  memcpy(&r, &u, 4);
  return r;
}

/* NULL when oneDNN's bf16 GEMM can run here, else why not. It has kernels from AVX-512
** (avx512_core, bf16 emulated where AVX512_BF16 is missing) up, none for a CPU without
** AVX-512 ("unimplemented"): there the comparisons skip and the program exits 77, "Not
** Run" (tt_skip_main.h), which tools/test allows on such a CPU alone; the product refuses
** TETRA_BF16_GEMM=dot there anyway (choices_are_checked, which runs everywhere). */
static const char *onednn_missing(void) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw"))
    return "this CPU has no AVX-512, for which oneDNN has no bf16 GEMM";
  if (tt_bf16_gemm_select("dot", 1) == 0) return NULL;
  const char *ci = getenv("CI");
  cr_assert(!(ci && !strcmp(ci, "true")), "CI=true and oneDNN is missing: %s (tools/setup "
            "installs it)", tt_last_error());
  return "oneDNN is not installed";
}

static tt_tensor *leaf_copy(tt_tensor *t) {
  tt_tensor *c = NULL;
  cr_assert(tt_tensor_empty(t->shape, t->ndim, TT_F32, TT_CPU, &c) == 0);
  cr_assert(tt_copy_(c, t) == 0);
  cr_assert(tt_set_requires_grad(c, 1) == 0);
  return c;
}

typedef struct {
  double *y, *dx, *dw, *db;   /* f64 copies of the output and the gradients */
  int64_t dot_calls;          /* products oneDNN ran */
} result;

static void result_free(result *r) {
  free(r->y), free(r->dx), free(r->dw), free(r->db);
}

/* loss = sum(y * r) through tt_linear_lowp_ex in bf16, with fresh leaves x, w, b (so dy
** = r); mode "emulate" or "dot". out_dtype bf16: the forward only. */
static result run_linear(const char *mode, tt_tensor *x0, tt_tensor *w0, tt_tensor *b0,
                         tt_tensor *r, int out_dtype) {
  cr_assert(tt_bf16_gemm_select(mode, 1) == 0, "%s", tt_last_error());
  tt_tensor *x = leaf_copy(x0), *w = leaf_copy(w0), *b = leaf_copy(b0), *y = NULL;
  const int64_t before = tt_blas_calls("bf16-dot");
  cr_assert(tt_linear_lowp_ex(x, w, b, TT_BF16, out_dtype, &y) == 0, "%s", tt_last_error());
  result res = {tt_test_to_f64(y), NULL, NULL, NULL, 0};
  if (out_dtype == TT_F32) {
    tt_tensor *p = NULL, *loss = NULL;
    cr_assert(tt_mul(y, r, &p) == 0 && tt_sum(p, NULL, 0, 0, &loss) == 0, "%s",
              tt_last_error());
    cr_assert(tt_backward(loss) == 0, "%s", tt_last_error());
    res.dx = tt_test_to_f64(x->grad);
    res.dw = tt_test_to_f64(w->grad);
    res.db = tt_test_to_f64(b->grad);
    tt_tensor_release(p);
    tt_tensor_release(loss);
  }
  res.dot_calls = tt_blas_calls("bf16-dot") - before;
  tt_tensor *all[] = {x, w, b, y};
  for (int i = 0; i < 4; i++) tt_tensor_release(all[i]);
  cr_assert(tt_bf16_gemm_select("emulate", 1) == 0);
  return res;
}

/* got against the float64 value want of a sum of k exact terms whose magnitudes add to
** mag: k roundings of partial sums at most mag bound either library's error. */
static void check_sum(const char *what, int64_t i, double got, double want, double mag,
                      int64_t k) {
  const double tol = (double)k * 0x1p-24 * mag + 1e-30;
  cr_assert(fabs(got - want) <= tol, "%s[%lld]: %.9g, float64 of the rounded operands %.9g "
            "(tolerance %.3g)", what, (long long)i, got, want, tol);
}

Test(bf16_dot, linear_forward_and_gradients_match_the_emulation) {
  if (onednn_missing()) cr_skip_test("%s", onednn_missing());
  tt_set_num_threads(2);
  const int64_t xs[3] = {2, 37, IN}, ws[2] = {OUT, IN}, bs[1] = {OUT}, ys[3] = {2, 37, OUT};
  tt_tensor *x = tt_test_rand(xs, 3, 7), *w = tt_test_rand(ws, 2, 8), *b = tt_test_rand(bs, 1, 9);
  tt_tensor *r = tt_test_rand(ys, 3, 10);
  const float *X = tt_tensor_data(x), *W = tt_tensor_data(w), *B = tt_tensor_data(b),
              *R = tt_tensor_data(r);
  result emu = run_linear("emulate", x, w, b, r, TT_F32);
  result dot = run_linear("dot", x, w, b, r, TT_F32);
  result again = run_linear("dot", x, w, b, r, TT_F32);
  cr_assert_eq(emu.dot_calls, 0, "the emulation ran %lld products on oneDNN",
               (long long)emu.dot_calls);
  cr_assert_eq(dot.dot_calls, 3, "dot ran %lld of its 3 products (y, dx, dw) on oneDNN",
               (long long)dot.dot_calls);
  cr_assert(memcmp(dot.y, again.y, sizeof(double) * ROWS * OUT) == 0 &&
                memcmp(dot.dx, again.dx, sizeof(double) * ROWS * IN) == 0 &&
                memcmp(dot.dw, again.dw, sizeof(double) * OUT * IN) == 0,
            "a second dot run differs");

  for (int64_t i = 0; i < ROWS; i++)
    for (int64_t j = 0; j < OUT; j++) {   /* y = bf16(x) bf16(w)^T + b */
      double want = B[j], mag = fabs(B[j]);
      for (int64_t k = 0; k < IN; k++) {
        const double t = bf16r(X[i * IN + k]) * bf16r(W[j * IN + k]);
        want += t, mag += fabs(t);
      }
      check_sum("y emulate", i * OUT + j, emu.y[i * OUT + j], want, mag, IN + 1);
      check_sum("y dot", i * OUT + j, dot.y[i * OUT + j], want, mag, IN + 1);
    }
  for (int64_t i = 0; i < ROWS; i++)
    for (int64_t k = 0; k < IN; k++) {    /* dx = bf16(r) bf16(w) */
      double want = 0, mag = 0;
      for (int64_t j = 0; j < OUT; j++) {
        const double t = bf16r(R[i * OUT + j]) * bf16r(W[j * IN + k]);
        want += t, mag += fabs(t);
      }
      check_sum("dx emulate", i * IN + k, emu.dx[i * IN + k], want, mag, OUT);
      check_sum("dx dot", i * IN + k, dot.dx[i * IN + k], want, mag, OUT);
    }
  for (int64_t j = 0; j < OUT; j++) {
    double bwant = 0, bmag = 0;
    for (int64_t k = 0; k < IN; k++) {    /* dw = bf16(r)^T bf16(x) */
      double want = 0, mag = 0;
      for (int64_t i = 0; i < ROWS; i++) {
        const double t = bf16r(R[i * OUT + j]) * bf16r(X[i * IN + k]);
        want += t, mag += fabs(t);
      }
      check_sum("dw emulate", j * IN + k, emu.dw[j * IN + k], want, mag, ROWS);
      check_sum("dw dot", j * IN + k, dot.dw[j * IN + k], want, mag, ROWS);
    }
    for (int64_t i = 0; i < ROWS; i++) bwant += R[i * OUT + j], bmag += fabs(R[i * OUT + j]);
    check_sum("db dot", j, dot.db[j], bwant, bmag, ROWS);   /* the unrounded r's sum */
    cr_assert_eq(dot.db[j], emu.db[j], "db[%lld] differs between the two", (long long)j);
  }

  /* bf16 output: the one rounding of sums that agree to f32 rounding: equal, or one bf16
  ** step apart where a sum sits at a rounding boundary. */
  result emu16 = run_linear("emulate", x, w, b, r, TT_BF16);
  result dot16 = run_linear("dot", x, w, b, r, TT_BF16);
  for (int64_t i = 0; i < ROWS * OUT; i++)
    cr_assert(fabs(dot16.y[i] - emu16.y[i]) <= 0x1p-7 * fabs(emu16.y[i]),
              "bf16 y[%lld]: dot %.9g, emulate %.9g", (long long)i, dot16.y[i], emu16.y[i]);
  result all[] = {emu, dot, again, emu16, dot16};
  for (int i = 0; i < 5; i++) result_free(&all[i]);
  tt_tensor *ts[] = {x, w, b, r};
  for (int i = 0; i < 4; i++) tt_tensor_release(ts[i]);
}

/* The grouped GEMM (q, k and v in one): outputs and all gradients against the emulation. */
Test(bf16_dot, grouped_linear_matches_the_emulation) {
  if (onednn_missing()) cr_skip_test("%s", onednn_missing());
  tt_set_num_threads(2);
  const int64_t xs[2] = {ROWS, IN}, w0s[2] = {64, IN}, w1s[2] = {32, IN};
  tt_tensor *x0 = tt_test_rand(xs, 2, 21), *w00 = tt_test_rand(w0s, 2, 22),
            *w10 = tt_test_rand(w1s, 2, 23), *w20 = tt_test_rand(w1s, 2, 24);
  double *got[2][7];
  for (int m = 0; m < 2; m++) {
    cr_assert(tt_bf16_gemm_select(m ? "dot" : "emulate", 1) == 0);
    const int64_t before = tt_blas_calls("bf16-dot");
    tt_tensor *x = leaf_copy(x0), *w[3] = {leaf_copy(w00), leaf_copy(w10), leaf_copy(w20)};
    tt_tensor *y[3] = {NULL, NULL, NULL}, *loss = NULL;
    cr_assert(tt_linear_lowp_group(x, w, NULL, 3, TT_BF16, TT_F32, y) == 0, "%s",
              tt_last_error());
    /* loss = sum(y0 * y0) + sum(y1) + sum(y2 * y2): different gradients per part */
    tt_tensor *s0 = NULL, *s1 = NULL, *s2 = NULL, *p0 = NULL, *p2 = NULL, *t = NULL;
    cr_assert(tt_mul(y[0], y[0], &p0) == 0 && tt_mul(y[2], y[2], &p2) == 0);
    cr_assert(tt_sum(p0, NULL, 0, 0, &s0) == 0 && tt_sum(y[1], NULL, 0, 0, &s1) == 0 &&
              tt_sum(p2, NULL, 0, 0, &s2) == 0);
    cr_assert(tt_add(s0, s1, &t) == 0 && tt_add(t, s2, &loss) == 0);
    cr_assert(tt_backward(loss) == 0, "%s", tt_last_error());
    for (int j = 0; j < 3; j++) got[m][j] = tt_test_to_f64(y[j]);
    got[m][3] = tt_test_to_f64(x->grad);
    for (int j = 0; j < 3; j++) got[m][4 + j] = tt_test_to_f64(w[j]->grad);
    const int64_t calls = tt_blas_calls("bf16-dot") - before;
    /* forward 1, dx 1, dw one per weight */
    cr_assert_eq(calls, m ? 5 : 0, "%s ran %lld products on oneDNN",
                 m ? "dot" : "emulate", (long long)calls);
    tt_tensor *all[] = {x, w[0], w[1], w[2], y[0], y[1], y[2], loss, s0, s1, s2, p0, p2, t};
    for (int i = 0; i < 14; i++) tt_tensor_release(all[i]);
  }
  cr_assert(tt_bf16_gemm_select("emulate", 1) == 0);
  /* Terms are at most |x| |w| <= 1 (y), |dy| |w| (dx), |dy| |x| (dw) with |dy| <= 2 |y| <=
  ** 2 IN; k roundings each, on both sides. */
  const int64_t n[7] = {ROWS * 64, ROWS * 32, ROWS * 32, ROWS * IN, 64 * IN, 32 * IN, 32 * IN};
  const double tol[7] = {2.0 * IN * IN * 0x1p-24, 2.0 * IN * IN * 0x1p-24,
                         2.0 * IN * IN * 0x1p-24, 2.0 * 128 * 128 * 2 * IN * 0x1p-24,
                         2.0 * ROWS * ROWS * 2 * IN * 0x1p-24, 2.0 * ROWS * ROWS * 0x1p-24,
                         2.0 * ROWS * ROWS * 2 * IN * 0x1p-24};
  const char *names[7] = {"y0", "y1", "y2", "dx", "dw0", "dw1", "dw2"};
  for (int j = 0; j < 7; j++) {
    for (int64_t i = 0; i < n[j]; i++)
      cr_assert(fabs(got[1][j][i] - got[0][j][i]) <= tol[j], "%s[%lld]: dot %.9g, emulate "
                "%.9g (tolerance %.3g)", names[j], (long long)i, got[1][j][i], got[0][j][i],
                tol[j]);
    free(got[0][j]), free(got[1][j]);
  }
  tt_tensor *ts[] = {x0, w00, w10, w20};
  for (int i = 0; i < 4; i++) tt_tensor_release(ts[i]);
}

Test(bf16_dot, choices_are_checked) {
  cr_assert(tt_bf16_gemm_select("amx", 1) != 0);
  cr_assert(strstr(tt_last_error(), "emulate (the default) or dot") != NULL, "%s",
            tt_last_error());
  cr_assert(tt_bf16_gemm_select("dot", 0) != 0);
  cr_assert(strstr(tt_last_error(), "no AVX512_BF16") != NULL, "%s", tt_last_error());
  cr_assert_str_eq(tt_bf16_gemm_selected(), "emulate");
  cr_assert(tt_bf16_gemm_select(NULL, 0) == 0 && tt_bf16_gemm_select("", 0) == 0);
  cr_assert_str_eq(tt_bf16_gemm_selected(), "emulate");
}

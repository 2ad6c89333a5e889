/*
** test_fp8_linear.c — tt_fp8_linear on a GPU (engine/cuda/fp8_linear.cu: cuBLASLt FP8
** GEMMs, device-side delayed scaling) against the CPU emulation (engine/ops/fp8.c), which
** tests/c/test_fp8.c pins to a float64 model of the same arithmetic.
**
** Both sides quantise with the same float scales, so the fp8 codes are equal, and every
** product of two fp8 values is exact in fp32. The CPU sums them in fp32; Hopper's FP8
** tensor cores do not: their accumulator keeps about 14 bits (DeepSeek-V3's report,
** section 3.3.2), and the first H200 run found Y two bf16 ulps off the emulation on an
** element near zero (-0.02026 against -0.02051, in a row of outputs of order 2). So a
** bf16 result may differ by one ulp of itself plus 2^-13 of the tensor's largest
** magnitude (a wrong scale, bias or code is off by far more), on at most 5% of the
** elements; dW (f32) to 1e-5 relative L2. After each of three steps the device metas,
** brought back with tt_fp8_linear_state_sync, must equal the CPU's bit for bit (scales,
** ring, history). The bounds come from that one element: the next GPU run confirms them.
**
** Without a GPU the program exits 77 before running anything: ctest reports "Not Run".
*/
#include "cuda_test.h"
#include "tetra_amp.h"

static double *host_values(tt_tensor *t) {
  tt_tensor *h = to_dev(t, TT_CPU);
  double *v = malloc(sizeof(double) * (size_t)tt_tensor_numel(h));
  cr_assert_not_null(v);
  cr_assert_eq(tt_tensor_to_f64(h, v), 0, "%s", tt_last_error());
  tt_tensor_release(h);
  return v;
}

/* GPU and CPU bf16 results: within one bf16 ulp of the element plus 2^-13 of the largest
** magnitude (the tensor cores' FP8 accumulator), and equal on all but 5%. */
static void expect_bf16_close(const char *what, tt_tensor *gpu, tt_tensor *cpu) {
  int64_t n = tt_tensor_numel(cpu), differ = 0;
  double *g = host_values(gpu), *c = host_values(cpu), big = 0;
  for (int64_t i = 0; i < n; i++) big = fmax(big, fabs(c[i]));
  for (int64_t i = 0; i < n; i++) {
    cr_assert(!isnan(g[i]), "%s: element %lld is NaN", what, (long long)i);
    if (g[i] == c[i]) continue;
    differ++;
    int e;
    frexp(fabs(c[i]), &e);
    const double ulp = ldexp(1.0, (e - 1 < -126 ? -126 : e - 1) - 7);
    cr_assert(fabs(g[i] - c[i]) <= ulp + ldexp(big, -13),
              "%s: element %lld: gpu %.9g cpu %.9g (largest |value| %.4g)", what, (long long)i,
              g[i], c[i], big);
  }
  cr_log_info("%s: %lld of %lld elements differ", what, (long long)differ, (long long)n);
  cr_assert(differ <= n / 20, "%s: %lld of %lld elements differ", what, (long long)differ,
            (long long)n);
  free(g);
  free(c);
}

static void expect_same_meta(const char *what, const tt_fp8_meta *g, const tt_fp8_meta *c) {
  cr_assert_eq((float)g->scale, (float)c->scale, "%s: scale gpu %.9g cpu %.9g", what,
               g->scale, c->scale);
  cr_assert_eq(g->pos, c->pos, "%s: pos", what);
  cr_assert_eq(g->filled, c->filled, "%s: filled", what);
  for (int i = 0; i < c->filled; i++)
    cr_assert_eq(g->amax_history[i], c->amax_history[i], "%s: history[%d]", what, i);
}

static tt_tensor *leaf(tt_tensor *t) {
  cr_assert_eq(tt_set_requires_grad(t, 1), 0, "%s", tt_last_error());
  return t;
}

/* Three steps of CPU emulation and CUDA side by side. fast_accum: the CUDA forward uses
** cuBLASLt's fast accumulation, which the emulation does not model: Y is then held to a
** relative error (its sums lose low bits along k) while the backward, which never uses
** it, must still match to the bf16 ulp. */
static void run_steps(int x_dtype, int fast_accum) {
  enum { B = 2, T = 32, IN = 96, OUT = 48 };
  tt_manual_seed(11);
  int64_t xs[3] = {B, T, IN}, ws[2] = {OUT, IN}, bs[1] = {OUT}, ys[3] = {B, T, OUT};
  tt_tensor *x0 = randn(xs, 3, 1.0), *w = leaf(randn(ws, 2, 0.2)), *b = leaf(randn(bs, 1, 0.1));
  tt_tensor *g0 = randn(ys, 3, 1e-3);
  tt_tensor *wd = leaf(to_dev(w, GPU)), *bd = leaf(to_dev(b, GPU));
  tt_fp8_linear_state cs, gs;
  cr_assert_eq(tt_fp8_linear_state_init(&cs, 2, 0), 0);
  cr_assert_eq(tt_fp8_linear_state_init(&gs, 2, 0), 0);
  gs.fast_accum = fast_accum;
  const double xf[3] = {1.0, 4.0, 0.5}, gf[3] = {1.0, 0.25, 8.0};
  for (int step = 0; step < 3; step++) {
    tt_tensor *xs32 = NULL, *x = NULL, *gs32 = NULL, *gy = NULL;
    cr_assert_eq(tt_scale(x0, xf[step], &xs32), 0);
    cr_assert_eq(tt_cast(xs32, x_dtype, &x), 0);   /* the CPU side gets the same values */
    cr_assert_eq(tt_scale(g0, gf[step], &gs32), 0);
    cr_assert_eq(tt_cast(gs32, x_dtype, &gy), 0);  /* an output gradient of Y's dtype */
    leaf(x);
    tt_tensor *xd = leaf(to_dev(x, GPU)), *gyd = to_dev(gy, GPU);
    tt_tensor *y = NULL, *yd = NULL;
    poison(B * T * OUT * 4);
    cr_assert_eq(tt_fp8_linear(x, w, b, &cs, &y), 0, "%s", tt_last_error());
    cr_assert_eq(tt_fp8_linear(xd, wd, bd, &gs, &yd), 0, "%s", tt_last_error());
    cr_assert_eq(yd->dtype, x_dtype);
    if (fast_accum)
      cr_assert(rel_err(yd, y) <= 1e-2, "Y with fast accumulation: %g", rel_err(yd, y));
    else
      expect_bf16_close("Y", yd, y);
    cr_assert_eq(tt_backward_with(y, gy), 0, "%s", tt_last_error());
    cr_assert_eq(tt_backward_with(yd, gyd), 0, "%s", tt_last_error());
    expect_bf16_close("dX", xd->grad, x->grad);
    cr_assert(rel_err(wd->grad, w->grad) <= 1e-5, "dW");
    cr_assert(rel_err(bd->grad, b->grad) <= 1e-5, "db");
    cr_assert_eq(tt_fp8_linear_state_sync(&gs, 0), 0, "%s", tt_last_error());
    expect_same_meta("x", &gs.x, &cs.x);
    expect_same_meta("w", &gs.w, &cs.w);
    expect_same_meta("g", &gs.g, &cs.g);
    tt_tensor *grads[4] = {w, b, wd, bd};
    for (int i = 0; i < 4; i++) {
      tt_tensor_release(grads[i]->grad);
      grads[i]->grad = NULL;
    }
    tt_tensor *all[] = {xs32, x, gs32, gy, xd, gyd, y, yd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  }
  tt_fp8_linear_state_release(&gs);
  cr_assert_null(gs.device);
  tt_tensor *all[] = {x0, w, b, g0, wd, bd};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

Test(fp8_linear, f32_activations_match_cpu_emulation) { run_steps(TT_F32, 0); }
Test(fp8_linear, bf16_activations_match_cpu_emulation) { run_steps(TT_BF16, 0); }
Test(fp8_linear, fast_accumulation_stays_close_to_the_emulation) { run_steps(TT_BF16, 1); }

/* A shape cuBLASLt's FP8 GEMMs cannot take is refused before anything runs. */
Test(fp8_linear, refuses_dims_not_multiple_of_16) {
  int64_t xs[2] = {32, 24}, ws[2] = {16, 24};
  tt_tensor *x = to_dev(randn(xs, 2, 1.0), GPU), *w = to_dev(randn(ws, 2, 1.0), GPU), *y = NULL;
  tt_fp8_linear_state st;
  cr_assert_eq(tt_fp8_linear_state_init(&st, 4, 0), 0);
  cr_assert_eq(tt_fp8_linear(x, w, NULL, &st, &y), -1);
  cr_assert(strstr(tt_last_error(), "multiples of 16") != NULL, "%s", tt_last_error());
  tt_fp8_linear_state_release(&st);
  tt_tensor_release(x);
  tt_tensor_release(w);
}

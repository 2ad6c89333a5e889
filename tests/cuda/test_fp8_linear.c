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
** bf16 result may differ by one ulp of itself plus 2^-12 of the tensor's largest
** magnitude (a wrong scale, bias or code is off by far more), on at most 10% of the
** elements; dW (f32, the same accumulator with no bf16 rounding to hide it) to 1e-3
** relative L2. After each of three steps the device metas, brought back with
** tt_fp8_linear_state_sync, must equal the CPU's bit for bit (scales, ring, history,
** quantisation count). The bounds come from that one element, with room (a desk review
** put dW's error near 1e-4 and the differing share near 5%): the next GPU run prints the
** counts (cr_log_info) and confirms them.
** Under activation recompute (full, and selective keeping the product) the layer's
** outputs, gradients and metas must be those of the plain layer on the GPU, bit for bit;
** with deferred weight gradients too; and an inference forward records nothing.
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

/* GPU and CPU bf16 results: within one bf16 ulp of the element plus 2^-12 of the largest
** magnitude (the tensor cores' FP8 accumulator), and equal on all but 10%. */
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
    cr_assert(fabs(g[i] - c[i]) <= ulp + ldexp(big, -12),
              "%s: element %lld: gpu %.9g cpu %.9g (largest |value| %.4g)", what, (long long)i,
              g[i], c[i], big);
  }
  cr_log_info("%s: %lld of %lld elements differ", what, (long long)differ, (long long)n);
  cr_assert(differ <= n / 10, "%s: %lld of %lld elements differ", what, (long long)differ,
            (long long)n);
  free(g);
  free(c);
}

static void expect_same_meta(const char *what, const tt_fp8_meta *g, const tt_fp8_meta *c) {
  cr_assert_eq((float)g->scale, (float)c->scale, "%s: scale gpu %.9g cpu %.9g", what,
               g->scale, c->scale);
  cr_assert_eq(g->pos, c->pos, "%s: pos", what);
  cr_assert_eq(g->filled, c->filled, "%s: filled", what);
  cr_assert_eq(g->quantised, c->quantised, "%s: quantised", what);
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
** it, must still match to the bf16 ulp. zero_first: the first step's input and output
** gradient are all zeros (amax 0, which no history records), so the second step quantises
** at the delayed scale of an empty history, 1, on both sides: the first quantisation alone
** scales from its own amax (the device cannot tell the host that a history is still
** empty without a sync, and the CPU twin counts as the GPU does). */
static void run_steps(int x_dtype, int fast_accum, int zero_first) {
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
  double xf[3] = {1.0, 4.0, 0.5}, gf[3] = {1.0, 0.25, 8.0};
  if (zero_first) xf[0] = gf[0] = 0.0;
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
    cr_assert(rel_err(wd->grad, w->grad) <= 1e-3, "dW: %g", rel_err(wd->grad, w->grad));
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

Test(fp8_linear, f32_activations_match_cpu_emulation) { run_steps(TT_F32, 0, 0); }
Test(fp8_linear, bf16_activations_match_cpu_emulation) { run_steps(TT_BF16, 0, 0); }
Test(fp8_linear, fast_accumulation_stays_close_to_the_emulation) { run_steps(TT_BF16, 1, 0); }
Test(fp8_linear, all_zero_first_step_matches_cpu_emulation) { run_steps(TT_BF16, 0, 1); }

/* A shape cuBLASLt's FP8 GEMMs cannot take is refused before anything runs. */
Test(fp8_linear, refuses_dims_not_multiple_of_16) {
  int64_t xs[2] = {32, 24}, ws[2] = {16, 24};
  tt_tensor *x = to_dev(randn(xs, 2, 1.0), GPU), *w = to_dev(randn(ws, 2, 1.0), GPU), *y = NULL;
  tt_fp8_linear_state st;
  cr_assert_eq(tt_fp8_linear_state_init(&st, 4, 0), 0);
  cr_assert_eq(tt_fp8_linear(x, w, NULL, &st, &y), -1);
  cr_assert(strstr(tt_last_error(), "multiples of 16") != NULL, "%s", tt_last_error());
  /* No rows: the casts would launch an empty grid. */
  int64_t es[2] = {0, 32}, ew[2] = {16, 32};
  tt_tensor *xe = to_dev(randn(es, 2, 1.0), GPU), *we = to_dev(randn(ew, 2, 1.0), GPU);
  cr_assert_eq(tt_fp8_linear(xe, we, NULL, &st, &y), -1);
  cr_assert(strstr(tt_last_error(), "each must be between 1 and") != NULL, "%s",
            tt_last_error());
  tt_fp8_linear_state_release(&st);
  tt_tensor *all[] = {x, w, xe, we};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) tt_tensor_release(all[i]);
}

/* -- Twins: the same layer run two ways ---------------------------------------------- */

/* One layer's weights twice on the GPU, each with its own fresh scaling state: run 0 is
** the plain layer, run 1 the way under test, and everything they make must be the same
** bits. x0 and g0 are the input and the output gradient the steps scale. */
typedef struct twins {
  tt_tensor *x0, *g0, *w0, *b0, *w[2], *b[2];
  tt_fp8_linear_state st[2];
} twins;

static void twins_init(twins *t, int64_t rows_b, int64_t rows_t, int64_t in, int64_t out,
                       uint64_t seed) {
  tt_manual_seed(seed);
  int64_t xs[3] = {rows_b, rows_t, in}, ws[2] = {out, in}, bs[1] = {out};
  int64_t ys[3] = {rows_b, rows_t, out};
  t->x0 = to_dev(randn(xs, 3, 1.0), GPU);
  t->g0 = to_dev(randn(ys, 3, 1e-3), GPU);
  t->w0 = randn(ws, 2, 0.2);
  t->b0 = randn(bs, 1, 0.1);
  for (int k = 0; k < 2; k++) {
    t->w[k] = leaf(to_dev(t->w0, GPU));
    t->b[k] = leaf(to_dev(t->b0, GPU));
    cr_assert_eq(tt_fp8_linear_state_init(&t->st[k], 2, 0), 0);
  }
}

static void expect_same_bits(const char *what, tt_tensor *plain, tt_tensor *other) {
  int64_t n = tt_tensor_numel(plain);
  cr_assert_eq(n, tt_tensor_numel(other), "%s: sizes", what);
  double *a = host_values(plain), *b = host_values(other);
  for (int64_t i = 0; i < n; i++)
    cr_assert(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])),
              "%s: element %lld: %.9g against the plain layer's %.9g", what, (long long)i,
              b[i], a[i]);
  free(a);
  free(b);
}

/* After a step: the gradients of x, w and b and the three metas the same bits; then the
** step's tensors go. */
static void twins_expect_same_step(twins *t, tt_tensor **x, tt_tensor **y) {
  expect_same_bits("dX", x[0]->grad, x[1]->grad);
  expect_same_bits("dW", t->w[0]->grad, t->w[1]->grad);
  expect_same_bits("db", t->b[0]->grad, t->b[1]->grad);
  for (int k = 0; k < 2; k++) cr_assert_eq(tt_fp8_linear_state_sync(&t->st[k], 0), 0);
  expect_same_meta("x", &t->st[1].x, &t->st[0].x);
  expect_same_meta("w", &t->st[1].w, &t->st[0].w);
  expect_same_meta("g", &t->st[1].g, &t->st[0].g);
  for (int k = 0; k < 2; k++) {
    tt_zero_grad(t->w[k]);
    tt_zero_grad(t->b[k]);
    tt_tensor_release(x[k]);
    tt_tensor_release(y[k]);
  }
}

static void twins_free(twins *t) {
  for (int k = 0; k < 2; k++) {
    tt_fp8_linear_state_release(&t->st[k]);
    tt_tensor_release(t->w[k]);
    tt_tensor_release(t->b[k]);
  }
  tt_tensor *all[] = {t->x0, t->g0, t->w0, t->b0};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
}

/* -- Activation recompute ------------------------------------------------------------ */

/* The layer as a checkpointed block: its first run records nothing and stashes the
** scales it used (a device tensor); the hook re-runs it in backward from a leaf sharing
** x's storage, and that re-run must quantise with the stashed scales and record no amax. */
typedef struct fp8_block {
  twins *t;
  int reruns;
} fp8_block;

static int fp8_rerun(int64_t key, tt_tensor *x, tt_tensor *grad_out, void *ud) {
  (void)key;
  fp8_block *blk = ud;
  tt_tensor *y = NULL;
  blk->reruns++;
  int rc = tt_fp8_linear(x, blk->t->w[1], blk->t->b[1], &blk->t->st[1], &y);
  tt_checkpoint_rerun_done();
  if (rc == 0) rc = tt_backward_with(y, grad_out);
  tt_tensor_release(y);
  return rc;
}

/* Three steps, with the input and gradient scaled so the histories move, of the plain
** layer and of the checkpointed one (full: keep nothing; selective: keep the product):
** the outputs, all three gradients and the metas must be the same bits. A re-run that
** read the moved metas would quantise at other scales and record the amaxes of x and w
** twice. */
static void recompute_steps(int selective) {
  twins t;
  twins_init(&t, 2, 32, 64, 48, 13);
  fp8_block blk = {&t, 0};
  tt_set_recompute_hook(fp8_rerun, &blk);
  const double xf[3] = {1.0, 4.0, 0.5}, gf[3] = {1.0, 0.25, 8.0};
  for (int step = 0; step < 3; step++) {
    tt_tensor *xb = NULL, *gy = NULL, *x[2], *y[2] = {NULL, NULL};
    cr_assert_eq(tt_scale(t.x0, xf[step], &xb), 0, "%s", tt_last_error());
    cr_assert_eq(tt_scale(t.g0, gf[step], &gy), 0, "%s", tt_last_error());
    for (int k = 0; k < 2; k++) {
      cr_assert_eq(tt_detach(xb, &x[k]), 0);
      leaf(x[k]);
    }
    cr_assert_eq(tt_fp8_linear(x[0], t.w[0], t.b[0], &t.st[0], &y[0]), 0, "%s",
                 tt_last_error());
    tt_set_grad_enabled(0);
    tt_checkpoint_begin();
    tt_checkpoint_keep_gemms(selective);
    int rc = tt_fp8_linear(x[1], t.w[1], t.b[1], &t.st[1], &y[1]);
    tt_set_grad_enabled(1);
    if (rc == 0) rc = tt_checkpoint(x[1], y[1], 1);
    else tt_checkpoint_cancel();
    cr_assert_eq(rc, 0, "%s", tt_last_error());
    expect_same_bits("Y (first run)", y[0], y[1]);
    cr_assert_eq(tt_backward_with(y[0], gy), 0, "%s", tt_last_error());
    cr_assert_eq(tt_backward_with(y[1], gy), 0, "%s", tt_last_error());
    cr_assert_eq(blk.reruns, step + 1);
    twins_expect_same_step(&t, x, y);
    tt_tensor_release(xb);
    tt_tensor_release(gy);
  }
  tt_set_recompute_hook(NULL, NULL);
  twins_free(&t);
}

Test(fp8_linear, full_recompute_reruns_with_the_first_runs_scales) { recompute_steps(0); }
Test(fp8_linear, selective_recompute_takes_back_the_kept_product) { recompute_steps(1); }

/* Data parallelism defers the first blocks' weight gradients to a second pass
** (tt_set_deferred_grads). The layer's backward quantises the output gradient and records
** its amax, so it must run whole, never split in two passes: dX, dW, db and the metas the
** same bits as without deferring, over three steps. */
Test(fp8_linear, deferred_weight_gradients_run_the_backward_once) {
  twins t;
  twins_init(&t, 2, 16, 32, 64, 17);
  const double gf[3] = {1.0, 0.25, 8.0};
  for (int step = 0; step < 3; step++) {
    tt_tensor *gy = NULL, *x[2], *y[2] = {NULL, NULL};
    cr_assert_eq(tt_scale(t.g0, gf[step], &gy), 0, "%s", tt_last_error());
    for (int k = 0; k < 2; k++) {
      cr_assert_eq(tt_detach(t.x0, &x[k]), 0);
      leaf(x[k]);
      if (k == 1) {
        tt_tensor *later[2] = {t.w[1], t.b[1]};
        cr_assert_eq(tt_set_deferred_grads(later, 2), 0, "%s", tt_last_error());
      }
      cr_assert_eq(tt_fp8_linear(x[k], t.w[k], t.b[k], &t.st[k], &y[k]), 0, "%s",
                   tt_last_error());
      cr_assert_eq(tt_backward_with(y[k], gy), 0, "%s", tt_last_error());
      cr_assert_eq(tt_set_deferred_grads(NULL, 0), 0);
    }
    twins_expect_same_step(&t, x, y);
    tt_tensor_release(gy);
  }
  twins_free(&t);
}

/* -- Inference ------------------------------------------------------------------------ */

/* A forward with recording off (evaluation, generation) quantises at the scales a
** training forward would use and records nothing: on a fresh state at the scale its
** input's own amax gives (the first training forward's), the history left empty; later,
** at the delayed scales, the metas unmoved, so the next training forward is that of a
** layer that never ran the inference. */
Test(fp8_linear, inference_uses_the_current_scales_and_records_nothing) {
  twins t;
  twins_init(&t, 2, 16, 32, 48, 19);
  tt_tensor *y[2] = {NULL, NULL}, *yi = NULL, *x2 = NULL;
  cr_assert_eq(tt_fp8_linear(t.x0, t.w[0], t.b[0], &t.st[0], &y[0]), 0, "%s", tt_last_error());
  tt_set_grad_enabled(0);
  cr_assert_eq(tt_fp8_linear(t.x0, t.w[1], t.b[1], &t.st[1], &yi), 0, "%s", tt_last_error());
  tt_set_grad_enabled(1);
  expect_same_bits("Y (fresh inference)", y[0], yi);
  cr_assert_eq(tt_fp8_linear_state_sync(&t.st[1], 0), 0);
  cr_assert_eq(t.st[1].x.filled, 0, "the fresh history recorded an inference");
  cr_assert_eq(t.st[1].w.filled, 0);
  tt_tensor_release(yi);
  tt_tensor_release(y[0]);
  /* Twin 1 trains once too (twin 0 did, above); then twin 1 infers on a larger input. */
  cr_assert_eq(tt_fp8_linear(t.x0, t.w[1], t.b[1], &t.st[1], &y[1]), 0, "%s", tt_last_error());
  tt_tensor_release(y[1]);
  cr_assert_eq(tt_scale(t.x0, 50.0, &x2), 0, "%s", tt_last_error());
  tt_set_grad_enabled(0);
  cr_assert_eq(tt_fp8_linear(x2, t.w[1], t.b[1], &t.st[1], &yi), 0, "%s", tt_last_error());
  tt_set_grad_enabled(1);
  for (int k = 0; k < 2; k++) cr_assert_eq(tt_fp8_linear_state_sync(&t.st[k], 0), 0);
  expect_same_meta("x", &t.st[1].x, &t.st[0].x);
  expect_same_meta("w", &t.st[1].w, &t.st[0].w);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(tt_fp8_linear(x2, t.w[k], t.b[k], &t.st[k], &y[k]), 0, "%s", tt_last_error());
  expect_same_bits("Y (inference at the delayed scales)", y[0], yi);
  expect_same_bits("Y (the training forward after it)", y[0], y[1]);
  tt_tensor *all[] = {y[0], y[1], yi, x2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_tensor_release(all[i]);
  twins_free(&t);
}

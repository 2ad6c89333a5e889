/*
** test_ops_optim_multi.c — the multi-tensor optimizer ops on CPU (the twins of the CUDA
** kernels): tt_adamw_multi is bitwise tt_adamw_step, per tensor, over many odd-sized
** tensors (a strided grad, a parameter without grad); the gradient scale it reads from the
** step stats equals scaling the grads first; found_inf leaves everything untouched; the
** bf16 copies are the updated weights rounded to nearest even; tt_grad_sumsq and
** tt_clip_finish match a float64 loop; bad arguments fail with one line, nothing written.
*/
#include "tt_test.h"
#include "core/tt_internal.h"
#include "tetra_amp.h"

enum { NT = 9 };

/* Odd sizes, one above the parallel grain, one empty-ish row. */
static const int64_t shapes[NT][2] = {{7, 13}, {5, 1}, {311, 217}, {1, 1}, {3, 129},
                                      {65, 3}, {1, 1023}, {17, 17}, {2, 5}};

typedef struct {
  tt_tensor *p[NT], *m[NT], *v[NT];
} set;

static tt_tensor *clone(const tt_tensor *t) {
  tt_tensor *c = NULL;
  cr_assert(tt_tensor_zeros(t->shape, t->ndim, TT_F32, TT_CPU, &c) == 0);
  cr_assert(tt_copy_(c, t) == 0, "%s", tt_last_error());
  return c;
}

/* Parameters with random values and states with random moments (v >= 0). */
static void make_set(set *s, uint64_t seed) {
  for (int i = 0; i < NT; i++) {
    s->p[i] = tt_test_rand(shapes[i], 2, seed + i);
    s->m[i] = tt_test_rand(shapes[i], 2, seed + 100 + i);
    tt_tensor *r = tt_test_rand(shapes[i], 2, seed + 200 + i), *sq = NULL;
    cr_assert(tt_mul(r, r, &sq) == 0);
    s->v[i] = sq;
    tt_tensor_release(r);
  }
}

static void copy_set(set *dst, const set *src) {
  for (int i = 0; i < NT; i++) {
    dst->p[i] = clone(src->p[i]);
    dst->m[i] = clone(src->m[i]);
    dst->v[i] = clone(src->v[i]);
  }
}

/* Same grads on both sets (scaled by `scale` on b); p[3] has none; p[0]'s is strided. */
static void set_grads(set *a, set *b, uint64_t seed, float scale) {
  for (int i = 0; i < NT; i++) {
    tt_zero_grad(a->p[i]);
    tt_zero_grad(b->p[i]);
    if (i == 3) continue;
    tt_tensor *g = i == 0 ? tt_test_rand_strided(shapes[i], 2, seed + i)
                          : tt_test_rand(shapes[i], 2, seed + i);
    a->p[i]->grad = g;
    tt_tensor *h = clone(g);
    float *d = tt_tensor_data(h);
    for (int64_t j = 0; j < tt_tensor_numel(h); j++) d[j] = d[j] * scale;
    b->p[i]->grad = h;
  }
}

static void free_set(set *s) {
  for (int i = 0; i < NT; i++) {
    tt_zero_grad(s->p[i]);
    tt_tensor_release(s->p[i]);
    tt_tensor_release(s->m[i]);
    tt_tensor_release(s->v[i]);
  }
}

static void assert_bitwise(const tt_tensor *a, const tt_tensor *b, const char *what, int i) {
  int64_t n = tt_tensor_numel(a);
  cr_assert(memcmp(tt_tensor_data((tt_tensor *)a), tt_tensor_data((tt_tensor *)b),
                   sizeof(float) * (size_t)n) == 0,
            "%s[%d] differs from the per-tensor step", what, i);
}

static void assert_sets_equal(const set *a, const set *b) {
  for (int i = 0; i < NT; i++) {
    assert_bitwise(a->p[i], b->p[i], "p", i);
    assert_bitwise(a->m[i], b->m[i], "m", i);
    assert_bitwise(a->v[i], b->v[i], "v", i);
  }
}

static tt_tensor *stats_with(float grad_scale, float found_inf) {
  tt_tensor *s = NULL;
  cr_assert(tt_step_stats_new(TT_CPU, &s) == 0, "%s", tt_last_error());
  float *d = tt_tensor_data(s);
  cr_assert(d[TT_STAT_GRAD_SCALE] == 1.0f && d[TT_STAT_FOUND_INF] == 0.0f);
  d[TT_STAT_GRAD_SCALE] = grad_scale;
  d[TT_STAT_FOUND_INF] = found_inf;
  return s;
}

/* -- AdamW ---------------------------------------------------------------------------- */

Test(optim_multi, adamw_bitwise_per_tensor_three_steps) {
  set a, b;
  make_set(&a, 1);
  copy_set(&b, &a);
  tt_adamw_config cfg = {1e-2, 0.9, 0.95, 1e-8, 0.1, 0};
  for (int64_t step = 1; step <= 3; step++) {
    set_grads(&a, &b, 50 * step, 1.0f);
    cr_assert(tt_adamw_multi(a.p, a.m, a.v, NULL, NT, &cfg, step, NULL) == 0, "%s",
              tt_last_error());
    cr_assert(tt_adamw_step(b.p, b.m, b.v, NT, &cfg, step) == 0, "%s", tt_last_error());
    assert_sets_equal(&a, &b);
  }
  free_set(&a);
  free_set(&b);
}

Test(optim_multi, grad_scale_from_stats_equals_prescaled_grads) {
  set a, b;
  make_set(&a, 2);
  copy_set(&b, &a);
  tt_adamw_config cfg = {3e-3, 0.9, 0.999, 1e-8, 0.05, 0};
  float scale = 0.3712f;
  tt_tensor *stats = stats_with(scale, 0.0f);
  set_grads(&a, &b, 7, scale);
  cr_assert(tt_adamw_multi(a.p, a.m, a.v, NULL, NT, &cfg, 4, stats) == 0, "%s",
            tt_last_error());
  cr_assert(tt_adamw_step(b.p, b.m, b.v, NT, &cfg, 4) == 0, "%s", tt_last_error());
  assert_sets_equal(&a, &b);
  tt_tensor_release(stats);
  free_set(&a);
  free_set(&b);
}

Test(optim_multi, found_inf_writes_nothing) {
  set a, b;
  make_set(&a, 3);
  copy_set(&b, &a);
  tt_tensor *bf[NT];
  for (int i = 0; i < NT; i++) {
    cr_assert(tt_tensor_zeros(shapes[i], 2, TT_BF16, TT_CPU, &bf[i]) == 0);
    cr_assert(tt_fill_(bf[i], 2.5) == 0);
  }
  tt_adamw_config cfg = {1e-2, 0.9, 0.95, 1e-8, 0.1, 0};
  tt_tensor *stats = stats_with(1.0f, 1.0f);
  set_grads(&a, &b, 9, 1.0f);
  cr_assert(tt_adamw_multi(a.p, a.m, a.v, bf, NT, &cfg, 1, stats) == 0, "%s",
            tt_last_error());
  assert_sets_equal(&a, &b);   /* b never stepped */
  for (int i = 0; i < NT; i++)
    cr_assert(tt_tensor_get(bf[i], 0) == 2.5, "bf16[%d] written on a found_inf step", i);
  for (int i = 0; i < NT; i++) tt_tensor_release(bf[i]);
  tt_tensor_release(stats);
  free_set(&a);
  free_set(&b);
}

Test(optim_multi, bf16_copy_is_the_rounded_update) {
  set a, b;
  make_set(&a, 4);
  copy_set(&b, &a);
  tt_tensor *bf[NT];
  for (int i = 0; i < NT; i++) {
    bf[i] = NULL;
    if (i != 5)   /* one parameter without a copy */
      cr_assert(tt_tensor_zeros(shapes[i], 2, TT_BF16, TT_CPU, &bf[i]) == 0);
  }
  tt_adamw_config cfg = {1e-2, 0.9, 0.95, 1e-8, 0.1, 0};
  set_grads(&a, &b, 11, 1.0f);
  cr_assert(tt_adamw_multi(a.p, a.m, a.v, bf, NT, &cfg, 1, NULL) == 0, "%s",
            tt_last_error());
  cr_assert(tt_adamw_step(b.p, b.m, b.v, NT, &cfg, 1) == 0, "%s", tt_last_error());
  assert_sets_equal(&a, &b);
  for (int i = 0; i < NT; i++) {
    if (!bf[i]) continue;
    const float *p = tt_tensor_data(a.p[i]);
    const uint16_t *h = tt_tensor_data(bf[i]);
    /* p[3] has no grad: not stepped, its copy not written */
    for (int64_t j = 0; j < tt_tensor_numel(bf[i]); j++)
      cr_assert(h[j] == (i == 3 ? 0 : tt_float_to_bf16(p[j])),
                "bf16[%d][%lld] is not p rounded", i, (long long)j);
    tt_tensor_release(bf[i]);
  }
  free_set(&a);
  free_set(&b);
}

/* -- Gradient norm and clip coefficient ----------------------------------------------- */

static double ref_sumsq(tt_tensor *const *p, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) {
    if (!p[i]->grad) continue;
    double *g = tt_test_to_f64(p[i]->grad);
    for (int64_t j = 0; j < tt_tensor_numel(p[i]); j++) s += g[j] * g[j];
    free(g);
  }
  return s;
}

Test(optim_multi, sumsq_and_clip_finish_match_float64) {
  set a, b;
  make_set(&a, 5);
  copy_set(&b, &a);
  set_grads(&a, &b, 13, 1.0f);
  double want = ref_sumsq(a.p, NT), norm = sqrt(want);
  tt_tensor *stats = stats_with(1.0f, 0.0f);
  cr_assert(tt_grad_sumsq(a.p, NT, stats) == 0, "%s", tt_last_error());
  const float *s = tt_tensor_data(stats);
  double got = (double)s[TT_STAT_SUMSQ_HI] + (double)s[TT_STAT_SUMSQ_LO];
  cr_assert(fabs(got - want) <= 1e-13 * want, "sum of squares %.17g, want %.17g", got, want);
  double legacy;
  cr_assert(tt_grad_norm(a.p, NT, &legacy) == 0);
  cr_assert(fabs(legacy - sqrt(got)) <= 1e-13 * legacy);
  /* above the norm: coefficient 1 */
  cr_assert(tt_clip_finish(stats, NULL, 1.0, 2.0 * norm) == 0, "%s", tt_last_error());
  cr_assert(s[TT_STAT_GRAD_SCALE] == 1.0f);
  cr_assert(s[TT_STAT_GRAD_NORM] == (float)norm, "norm %.9g, want %.9g",
            s[TT_STAT_GRAD_NORM], norm);
  /* below: max / (norm + 1e-6), the coefficient tt_clip_grad_norm applies */
  cr_assert(tt_clip_finish(stats, NULL, 1.0, 0.25 * norm) == 0);
  cr_assert(s[TT_STAT_GRAD_SCALE] == (float)(0.25 * norm / (norm + 1e-6)), "coef %.9g",
            s[TT_STAT_GRAD_SCALE]);
  /* replicas divide the summed squares; max_norm 0 disables clipping */
  cr_assert(tt_clip_finish(stats, NULL, 4.0, 0.0) == 0);
  cr_assert(s[TT_STAT_GRAD_NORM] == (float)(norm / 2.0));
  cr_assert(s[TT_STAT_GRAD_SCALE] == 1.0f);
  /* gathered pairs of two ranks holding the same grads, counted as 2 replicas: the same */
  cr_assert(tt_grad_sumsq(a.p, NT, stats) == 0);
  int64_t four = 4;
  tt_tensor *gathered = NULL;
  cr_assert(tt_tensor_zeros(&four, 1, TT_F32, TT_CPU, &gathered) == 0);
  float *gp = tt_tensor_data(gathered);
  gp[0] = gp[2] = s[TT_STAT_SUMSQ_HI];
  gp[1] = gp[3] = s[TT_STAT_SUMSQ_LO];
  cr_assert(tt_clip_finish(stats, gathered, 2.0, 0.0) == 0, "%s", tt_last_error());
  cr_assert(s[TT_STAT_GRAD_NORM] == (float)norm, "gathered norm %.9g, want %.9g",
            s[TT_STAT_GRAD_NORM], norm);
  gp[2] *= 4.0f;   /* the second rank's part counts */
  gp[3] *= 4.0f;
  cr_assert(tt_clip_finish(stats, gathered, 1.0, 0.0) == 0);
  cr_assert(fabs(s[TT_STAT_GRAD_NORM] - sqrt(5.0) * norm) <= 1e-6 * norm);
  tt_tensor_release(gathered);
  /* a non-finite norm leaves the grads unscaled (the caller skips the step) */
  cr_assert(tt_fill_(a.p[2]->grad, INFINITY) == 0);
  cr_assert(tt_grad_sumsq(a.p, NT, stats) == 0);
  cr_assert(s[TT_STAT_FOUND_INF] == 0.0f);
  cr_assert(tt_clip_finish(stats, NULL, 1.0, 1.0) == 0);
  cr_assert(isinf(s[TT_STAT_GRAD_NORM]) && s[TT_STAT_GRAD_SCALE] == 1.0f);
  cr_assert(s[TT_STAT_FOUND_INF] == 1.0f, "a non-finite norm must skip the update");
  tt_tensor_release(stats);
  free_set(&a);
  free_set(&b);
}

Test(optim_multi, clip_through_stats_equals_clip_grad_norm_then_step) {
  set a, b;
  make_set(&a, 6);
  copy_set(&b, &a);
  set_grads(&a, &b, 17, 1.0f);
  tt_adamw_config cfg = {1e-2, 0.9, 0.95, 1e-8, 0.1, 0};
  double max_norm = 0.5 * sqrt(ref_sumsq(a.p, NT)), norm;
  tt_tensor *stats = stats_with(1.0f, 0.0f);
  cr_assert(tt_grad_sumsq(a.p, NT, stats) == 0);
  cr_assert(tt_clip_finish(stats, NULL, 1.0, max_norm) == 0);
  cr_assert(tt_adamw_multi(a.p, a.m, a.v, NULL, NT, &cfg, 1, stats) == 0);
  cr_assert(tt_clip_grad_norm(b.p, NT, max_norm, &norm) == 0);
  cr_assert(tt_adamw_step(b.p, b.m, b.v, NT, &cfg, 1) == 0);
  assert_sets_equal(&a, &b);
  tt_tensor_release(stats);
  free_set(&a);
  free_set(&b);
}

/* -- Errors --------------------------------------------------------------------------- */

Test(optim_multi, rejects_bad_arguments_without_side_effects) {
  set a, b;
  make_set(&a, 8);
  copy_set(&b, &a);
  set_grads(&a, &b, 19, 1.0f);
  tt_adamw_config cfg = {1e-3, 0.9, 0.999, 1e-8, 0.0, 0};
  tt_tensor *bf[NT] = {0}, *f32 = NULL, *small = NULL;
  cr_assert(tt_tensor_zeros(shapes[2], 2, TT_F32, TT_CPU, &f32) == 0);
  bf[2] = f32;   /* f32, not bf16: fails after params 0 and 1 were checked */
  tt_test_assert_error(tt_adamw_multi(a.p, a.m, a.v, bf, NT, &cfg, 1, NULL),
                       "adamw_multi: bf16[2] f32[311, 217] cpu must be a contiguous bf16 "
                       "tensor of the numel of params[2]");
  assert_sets_equal(&a, &b);
  int64_t three = 3;
  cr_assert(tt_tensor_zeros(&three, 1, TT_F32, TT_CPU, &small) == 0);
  tt_test_assert_error(tt_adamw_multi(a.p, a.m, a.v, NULL, NT, &cfg, 1, small),
                       "adamw_multi: stats f32[3] cpu must be a contiguous f32 tensor of 16");
  tt_test_assert_error(tt_grad_sumsq(a.p, NT, small), "grad_sumsq: stats f32[3] cpu");
  tt_test_assert_error(tt_adamw_multi(a.p, a.m, a.v, NULL, NT, &cfg, 0, NULL),
                       "adamw_multi: step is 1-based");
  tt_tensor *stats = stats_with(1.0f, 0.0f);
  tt_test_assert_error(tt_clip_finish(stats, NULL, 0.5, 1.0), "clip_finish: replicas must be >= 1");
  assert_sets_equal(&a, &b);
  tt_tensor_release(stats);
  tt_tensor_release(small);
  tt_tensor_release(f32);
  free_set(&a);
  free_set(&b);
}

/* -- Step stats: loss, found_inf, the one read ---------------------------------------- */

Test(optim_multi, step_stats_loss_unscale_and_read) {
  set a, b;
  make_set(&a, 21);
  copy_set(&b, &a);
  set_grads(&a, &b, 23, 0.5f);   /* b's grads: a's times 1 / loss scale 2 */
  tt_zero_grad(a.p[0]);          /* the strided one: unscaling wants contiguous grads */
  tt_zero_grad(b.p[0]);
  tt_tensor *stats = stats_with(1.0f, 0.0f), *loss = NULL;
  cr_assert(tt_tensor_full(NULL, 0, TT_F32, TT_CPU, 3.25, &loss) == 0, "%s", tt_last_error());
  cr_assert(tt_step_stats_set_loss(stats, loss) == 0, "%s", tt_last_error());
  cr_assert(tt_grads_unscale_to_stats(a.p, NT, 0.5, stats) == 0, "%s", tt_last_error());
  for (int i = 0; i < NT; i++)
    if (a.p[i]->grad) assert_bitwise(a.p[i]->grad, b.p[i]->grad, "unscaled grad", i);
  float out[TT_STEP_STATS_N];
  cr_assert(tt_step_stats_read(stats, out) == 0, "%s", tt_last_error());
  cr_assert(out[TT_STAT_LOSS] == 3.25f && out[TT_STAT_FOUND_INF] == 0.0f);
  cr_assert(tt_fill_(a.p[4]->grad, NAN) == 0);
  cr_assert(tt_grads_unscale_to_stats(a.p, NT, 0.5, stats) == 0);
  cr_assert(tt_step_stats_read(stats, out) == 0);
  cr_assert(out[TT_STAT_FOUND_INF] == 1.0f, "a NaN grad must set found_inf");
  cr_assert(tt_step_stats_reset(stats) == 0);
  cr_assert(tt_step_stats_read(stats, out) == 0);
  for (int k = 0; k < TT_STAT_LR; k++)
    cr_assert(out[k] == (k == TT_STAT_GRAD_SCALE ? 1.0f : 0.0f), "slot %d after reset", k);
  for (int k = TT_STAT_LR; k <= TT_STAT_INV_SCALE; k++)   /* set by the host: left alone */
    cr_assert(isnan(out[k]), "update slot %d after reset: %g (unset: NaN)", k, out[k]);
  tt_tensor_release(loss);
  tt_tensor_release(stats);
  free_set(&a);
  free_set(&b);
}

/* The update's lr and bias corrections from the stats (what a replayed CUDA graph uses):
** bitwise the update with lr and step as arguments, the values set for each step read by
** the same call (same cfg, same step argument: only the stats change), and an update that
** finds the slots unset refused before anything is written. */
Test(optim_multi, adamw_lr_from_stats) {
  set a, b;
  make_set(&a, 41);
  copy_set(&b, &a);
  tt_tensor *stats = stats_with(1.0f, 0.0f);
  tt_adamw_config ref = {3e-3, 0.9, 0.95, 1e-8, 0.1, 0};
  tt_adamw_config dev = ref;
  dev.lr = 123.0;   /* ignored: the stats' value is used */
  dev.lr_from_stats = 1;
  tt_test_assert_error(tt_adamw_multi(a.p, a.m, a.v, NULL, NT, &dev, 1, stats),
                       "adamw_multi: lr_from_stats, but the stats' update slots are unset");
  assert_sets_equal(&a, &b);
  const double lrs[3] = {3e-3, 1e-3, 7e-4};
  for (int64_t step = 1; step <= 3; step++) {
    set_grads(&a, &b, 13 * step, 1.0f);
    ref.lr = lrs[step - 1];
    cr_assert(tt_step_stats_set_update(stats, lrs[step - 1], 0.9, 0.95, step) == 0, "%s",
              tt_last_error());
    cr_assert(tt_adamw_multi(a.p, a.m, a.v, NULL, NT, &dev, 1, stats) == 0, "%s",
              tt_last_error());
    cr_assert(tt_adamw_step(b.p, b.m, b.v, NT, &ref, step) == 0, "%s", tt_last_error());
    assert_sets_equal(&a, &b);
  }
  tt_test_assert_error(tt_step_stats_set_update(stats, 1e-3, 0.9, 0.95, 0),
                       "step_stats_set_update: need lr >= 0, betas in [0, 1) and step >= 1");
  tt_test_assert_error(tt_adamw_multi(a.p, a.m, a.v, NULL, NT, &dev, 1, NULL),
                       "adamw_multi: lr_from_stats needs the stats tensor");
  tt_tensor_release(stats);
  free_set(&a);
  free_set(&b);
}

/* fp16's scale from the stats: unscaling by the stats' inverse scale is bitwise the
** unscale by the number, and it follows the value set for each step (only the stats
** change between the calls); unset (NaN), the unscale is refused. */
Test(optim_multi, unscale_by_stats_scale) {
  set a, b;
  make_set(&a, 31);
  copy_set(&b, &a);
  tt_zero_grad(a.p[0]);          /* the strided one: unscaling wants contiguous grads */
  tt_zero_grad(b.p[0]);
  tt_tensor *stats = stats_with(1.0f, 0.0f);
  tt_test_assert_error(tt_grads_unscale_by_stats(a.p, NT, stats),
                       "unscale grads: the inverse loss scale is nan");
  const double scales[2] = {1024.0, 3.0};
  for (int r = 0; r < 2; r++) {
    set_grads(&a, &b, 37 + r, 1.0f);
    tt_zero_grad(a.p[0]);
    tt_zero_grad(b.p[0]);
    cr_assert(tt_step_stats_set_scale(stats, scales[r]) == 0, "%s", tt_last_error());
    cr_assert(tt_grads_unscale_by_stats(a.p, NT, stats) == 0, "%s", tt_last_error());
    cr_assert(tt_grads_unscale_to_stats(b.p, NT, (double)(float)(1.0 / scales[r]), stats) == 0);
    for (int i = 0; i < NT; i++)
      if (a.p[i]->grad) assert_bitwise(a.p[i]->grad, b.p[i]->grad, "unscaled grad", i);
    float out[TT_STEP_STATS_N];
    cr_assert(tt_step_stats_read(stats, out) == 0);
    cr_assert(out[TT_STAT_LOSS_SCALE] == (float)scales[r] &&
              out[TT_STAT_INV_SCALE] == (float)(1.0 / scales[r]));
  }
  tt_test_assert_error(tt_step_stats_set_scale(stats, 0.0),
                       "step_stats_set_scale: the loss scale must be finite and > 0");
  tt_tensor_release(stats);
  free_set(&a);
  free_set(&b);
}

/* -- The offloaded update's thread (tt_adamw_jobs) ------------------------------------- */

/* Jobs on their own thread, each waited for in turn while this thread goes on, leave
** every tensor bitwise as one tt_adamw_multi call per tensor here; each job's weight
** decay is its own. A failing job (a moment of the wrong shape) is reported by the wait
** of it and of every later job, and by finish, with its message. */
Test(optim_multi, jobs_on_a_thread_equal_calls_here) {
  set a, b;
  make_set(&a, 7);
  copy_set(&b, &a);
  tt_adamw_config cfgs[NT];
  for (int i = 0; i < NT; i++) cfgs[i] = (tt_adamw_config){1e-2, 0.9, 0.95, 1e-8, 0.01 * i, 0};
  tt_tensor *stats = stats_with(0.5f, 0.0f);
  for (int64_t step = 1; step <= 2; step++) {
    set_grads(&a, &b, 70 * step, 1.0f);
    tt_adamw_jobs *j = NULL;
    cr_assert(tt_adamw_jobs_start(a.p, a.m, a.v, cfgs, NT, step, stats, &j) == 0, "%s",
              tt_last_error());
    for (int i = 0; i < NT; i++) {
      cr_assert(tt_adamw_multi(&b.p[i], &b.m[i], &b.v[i], NULL, 1, &cfgs[i], step, stats) == 0,
                "%s", tt_last_error());
      cr_assert(tt_adamw_jobs_wait(j, i) == 0, "%s", tt_last_error());
      assert_bitwise(a.p[i], b.p[i], "p", i);
      assert_bitwise(a.m[i], b.m[i], "m", i);
      assert_bitwise(a.v[i], b.v[i], "v", i);
    }
    cr_assert(tt_adamw_jobs_finish(j) == 0, "%s", tt_last_error());
  }
  tt_tensor *wrong = tt_test_rand(shapes[5], 2, 3), *keep = a.m[4];
  a.m[4] = wrong;
  set_grads(&a, &b, 900, 1.0f);
  tt_adamw_jobs *j = NULL;
  cr_assert(tt_adamw_jobs_start(a.p, a.m, a.v, cfgs, NT, 3, stats, &j) == 0, "%s",
            tt_last_error());
  cr_assert(tt_adamw_jobs_wait(j, 3) == 0, "%s", tt_last_error());
  cr_assert(tt_adamw_jobs_wait(j, 4) != 0, "the failed job was not reported");
  cr_assert(strstr(tt_last_error(), "job 4") != NULL, "%s", tt_last_error());
  cr_assert(tt_adamw_jobs_wait(j, NT - 1) != 0, "a later wait hid the failure");
  cr_assert(tt_adamw_jobs_finish(j) != 0, "finish hid the failure");
  a.m[4] = keep;
  tt_tensor_release(wrong);
  tt_tensor_release(stats);
  free_set(&a);
  free_set(&b);
}

/* Every step's set runs on the one worker (a thread per step made an OpenMP team per
** step), with the thread count the starting thread set, not the process default; sets
** started back to back run in order, each waited for by its own handle. */
Test(optim_multi, jobs_one_worker_with_the_callers_threads) {
  set a, b;
  make_set(&a, 9);
  copy_set(&b, &a);
  tt_adamw_config cfgs[NT];
  for (int i = 0; i < NT; i++) cfgs[i] = (tt_adamw_config){1e-2, 0.9, 0.95, 1e-8, 0.0, 0};
  tt_tensor *stats = stats_with(1.0f, 0.0f);
  int64_t starts = -1;
  int threads = -1;
  for (int64_t step = 1; step <= 3; step++) {
    tt_set_num_threads((int)(step % 2) + 1);   /* 2, 1, 2 */
    set_grads(&a, &b, 40 * step, 1.0f);
    tt_adamw_jobs *j = NULL;
    cr_assert(tt_adamw_jobs_start(a.p, a.m, a.v, cfgs, NT, step, stats, &j) == 0, "%s",
              tt_last_error());
    cr_assert(tt_adamw_jobs_finish(j) == 0, "%s", tt_last_error());
    tt_adamw_jobs_worker_info(&starts, &threads);
    cr_assert_eq(starts, 1, "step %lld: %lld update threads started", (long long)step,
                 (long long)starts);
    cr_assert_eq(threads, (int)(step % 2) + 1, "step %lld: the worker ran with %d threads",
                 (long long)step, threads);
    for (int i = 0; i < NT; i++)
      cr_assert(tt_adamw_multi(&b.p[i], &b.m[i], &b.v[i], NULL, 1, &cfgs[i], step, stats) == 0);
  }
  /* two sets in flight at once: the second waits for the first, both land */
  tt_adamw_jobs *j1 = NULL, *j2 = NULL;
  set_grads(&a, &b, 500, 1.0f);
  cr_assert(tt_adamw_jobs_start(a.p, a.m, a.v, cfgs, NT / 2, 4, stats, &j1) == 0);
  cr_assert(tt_adamw_jobs_start(a.p + NT / 2, a.m + NT / 2, a.v + NT / 2, cfgs, NT - NT / 2, 4,
                                stats, &j2) == 0);
  cr_assert(tt_adamw_jobs_wait(j2, NT - NT / 2 - 1) == 0, "%s", tt_last_error());
  cr_assert(tt_adamw_jobs_finish(j2) == 0);
  cr_assert(tt_adamw_jobs_finish(j1) == 0);
  for (int i = 0; i < NT; i++) {
    cr_assert(tt_adamw_multi(&b.p[i], &b.m[i], &b.v[i], NULL, 1, &cfgs[i], 4, stats) == 0);
    assert_bitwise(a.p[i], b.p[i], "p", i);
    assert_bitwise(a.v[i], b.v[i], "v", i);
  }
  tt_adamw_jobs_worker_info(&starts, NULL);
  cr_assert_eq(starts, 1);
  tt_tensor_release(stats);
  free_set(&a);
  free_set(&b);
}

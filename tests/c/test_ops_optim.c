/*
** test_ops_optim.c — fused AdamW and SGD steps over several parameters against float64
** loops of the textbook algorithms (PyTorch semantics), the float64 gradient norm and
** clipping, thread-count independence, and argument checks that leave every tensor
** untouched on failure.
*/
#include "tt_test.h"
#include "core/tt_internal.h"

enum { NP = 3 };

static const int64_t shapes[NP][2] = {{7, 13}, {5, 1}, {311, 217}};   /* the last > grain */

/* Sets p->grad to fresh random values; a strided view when `strided`. */
static void set_grad(tt_tensor *p, uint64_t seed, int strided) {
  tt_zero_grad(p);
  p->grad = strided ? tt_test_rand_strided(p->shape, p->ndim, seed)
                    : tt_test_rand(p->shape, p->ndim, seed);
}

static void make_params(tt_tensor **p, tt_tensor **s1, tt_tensor **s2) {
  for (int i = 0; i < NP; i++) {
    p[i] = tt_test_rand(shapes[i], 2, 100 + i);
    cr_assert(tt_tensor_zeros(shapes[i], 2, TT_F32, TT_CPU, &s1[i]) == 0);
    if (s2) cr_assert(tt_tensor_zeros(shapes[i], 2, TT_F32, TT_CPU, &s2[i]) == 0);
  }
}

static void release_all(tt_tensor **a, int n) {
  for (int i = 0; i < n; i++) {
    if (!a[i]) continue;
    tt_zero_grad(a[i]);
    tt_tensor_release(a[i]);
  }
}

/* -- AdamW ---------------------------------------------------------------------------- */

Test(optim, adamw_three_steps_match_float64) {
  tt_tensor *p[NP], *m[NP], *v[NP];
  make_params(p, m, v);
  tt_adamw_config cfg = {1e-2, 0.9, 0.95, 1e-8, 0.1, 0};
  double *rp[NP], *rm[NP], *rv[NP], *g = malloc(sizeof(double) * 311 * 217);
  int64_t n[NP];
  for (int i = 0; i < NP; i++) {
    n[i] = shapes[i][0] * shapes[i][1];
    rp[i] = tt_test_to_f64(p[i]);
    rm[i] = calloc((size_t)n[i], sizeof(double));
    rv[i] = calloc((size_t)n[i], sizeof(double));
  }
  double *untouched = tt_test_to_f64(p[1]);
  for (int64_t step = 1; step <= 3; step++) {
    /* param 1 has no grad: skipped; param 0 gets a strided grad */
    set_grad(p[0], 10 * step, 1);
    tt_zero_grad(p[1]);
    set_grad(p[2], 10 * step + 2, 0);
    for (int i = 0; i < NP; i++) {
      if (i == 1) continue;
      tt_tensor_to_f64(p[i]->grad, g);
      double bc1 = 1.0 - pow(cfg.beta1, (double)step), bc2 = 1.0 - pow(cfg.beta2, (double)step);
      for (int64_t j = 0; j < n[i]; j++) {
        rp[i][j] -= cfg.lr * cfg.weight_decay * rp[i][j];
        rm[i][j] = cfg.beta1 * rm[i][j] + (1.0 - cfg.beta1) * g[j];
        rv[i][j] = cfg.beta2 * rv[i][j] + (1.0 - cfg.beta2) * g[j] * g[j];
        double mhat = rm[i][j] / bc1, vhat = rv[i][j] / bc2;
        rp[i][j] -= cfg.lr * mhat / (sqrt(vhat) + cfg.eps);
      }
    }
    cr_assert(tt_adamw_step(p, m, v, NP, &cfg, step) == 0, "%s", tt_last_error());
  }
  for (int i = 0; i < NP; i++) {
    if (i == 1) continue;
    tt_test_assert_close(p[i], rp[i], n[i], 1e-5, 1e-6, "adamw params");
    tt_test_assert_close(m[i], rm[i], n[i], 1e-5, 1e-7, "adamw m");
    tt_test_assert_close(v[i], rv[i], n[i], 1e-5, 1e-8, "adamw v");
  }
  tt_test_assert_close(p[1], untouched, n[1], 0.0, 0.0, "param without grad");
  free(untouched);
  free(g);
  for (int i = 0; i < NP; i++) {
    free(rp[i]);
    free(rm[i]);
    free(rv[i]);
  }
  release_all(p, NP);
  release_all(m, NP);
  release_all(v, NP);
}

/* -- SGD ------------------------------------------------------------------------------ */

Test(optim, sgd_momentum_three_steps_match_float64) {
  tt_tensor *p[NP], *buf[NP];
  make_params(p, buf, NULL);
  double lr = 0.05, mu = 0.9, wd = 0.01;
  double *rp[NP], *rb[NP], *g = malloc(sizeof(double) * 311 * 217);
  int64_t n[NP];
  for (int i = 0; i < NP; i++) {
    n[i] = shapes[i][0] * shapes[i][1];
    rp[i] = tt_test_to_f64(p[i]);
    rb[i] = calloc((size_t)n[i], sizeof(double));
  }
  for (int step = 1; step <= 3; step++) {
    for (int i = 0; i < NP; i++) {
      set_grad(p[i], 50 * step + i, i == 0);
      tt_tensor_to_f64(p[i]->grad, g);
      for (int64_t j = 0; j < n[i]; j++) {
        double d = g[j] + wd * rp[i][j];
        rb[i][j] = step == 1 ? d : mu * rb[i][j] + d;   /* PyTorch: buf = d on step 1 */
        rp[i][j] -= lr * rb[i][j];
      }
    }
    cr_assert(tt_sgd_step(p, buf, NP, lr, mu, wd) == 0, "%s", tt_last_error());
  }
  for (int i = 0; i < NP; i++) {
    tt_test_assert_close(p[i], rp[i], n[i], 1e-5, 1e-6, "sgd params");
    tt_test_assert_close(buf[i], rb[i], n[i], 1e-5, 1e-6, "sgd momentum");
  }
  /* plain SGD: no buffers needed when mu = 0 */
  double *before = tt_test_to_f64(p[0]);
  tt_tensor_to_f64(p[0]->grad, g);
  cr_assert(tt_sgd_step(p, NULL, 1, 0.1, 0.0, 0.0) == 0, "%s", tt_last_error());
  for (int64_t j = 0; j < n[0]; j++) before[j] -= 0.1 * g[j];
  tt_test_assert_close(p[0], before, n[0], 1e-6, 1e-7, "plain sgd");
  free(before);
  free(g);
  for (int i = 0; i < NP; i++) {
    free(rp[i]);
    free(rb[i]);
  }
  release_all(p, NP);
  release_all(buf, NP);
}

/* -- Gradient norm and clipping ------------------------------------------------------- */

static double ref_norm(tt_tensor **p, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) {
    if (!p[i]->grad) continue;
    for (int64_t j = 0; j < tt_tensor_numel(p[i]); j++) {
      double v = tt_tensor_get(p[i]->grad, j);
      s += v * v;
    }
  }
  return sqrt(s);
}

Test(optim, grad_norm_float64_and_thread_independent) {
  tt_tensor *p[NP], *unused[NP];
  make_params(p, unused, NULL);
  set_grad(p[0], 1, 1);
  set_grad(p[2], 3, 0);   /* p[1] has no grad: counts as zero */
  double want = ref_norm(p, NP), got[2];
  int keep = tt_get_num_threads();
  for (int t = 0; t < 2; t++) {
    tt_set_num_threads(t + 1);
    cr_assert(tt_grad_norm(p, NP, &got[t]) == 0, "%s", tt_last_error());
  }
  tt_set_num_threads(keep);
  cr_assert(got[0] == got[1], "norm %.17g with 1 thread, %.17g with 2", got[0], got[1]);
  cr_assert(fabs(got[0] - want) <= 1e-12 * want, "norm %.17g, reference %.17g", got[0], want);
  release_all(p, NP);
  release_all(unused, NP);
}

Test(optim, clip_grad_norm) {
  tt_tensor *p[NP], *unused[NP];
  make_params(p, unused, NULL);
  for (int i = 0; i < NP; i++) set_grad(p[i], 7 + i, i == 0);
  double norm = ref_norm(p, NP), got;
  double *g2 = tt_test_to_f64(p[2]->grad);
  /* max_norm above the norm: nothing changes */
  cr_assert(tt_clip_grad_norm(p, NP, 2.0 * norm, &got) == 0, "%s", tt_last_error());
  cr_assert(fabs(got - norm) <= 1e-12 * norm);
  tt_test_assert_close(p[2]->grad, g2, tt_tensor_numel(p[2]), 0.0, 0.0, "unclipped grad");
  /* max_norm below: every grad (strided ones too) scaled by max / (norm + 1e-6) */
  double max_norm = 0.25 * norm, coef = max_norm / (norm + 1e-6);
  for (int64_t j = 0; j < tt_tensor_numel(p[2]); j++) g2[j] *= coef;
  cr_assert(tt_clip_grad_norm(p, NP, max_norm, &got) == 0, "%s", tt_last_error());
  cr_assert(fabs(got - norm) <= 1e-12 * norm, "returned %.17g, norm %.17g", got, norm);
  tt_test_assert_close(p[2]->grad, g2, tt_tensor_numel(p[2]), 1e-6, 0.0, "clipped grad");
  double after = ref_norm(p, NP);
  cr_assert(fabs(after - max_norm) <= 1e-5 * max_norm, "norm after clip %.9g, want %.9g",
            after, max_norm);
  free(g2);
  release_all(p, NP);
  release_all(unused, NP);
}

/* -- Errors --------------------------------------------------------------------------- */

Test(optim, rejects_bad_arguments_without_side_effects) {
  tt_tensor *p[NP], *m[NP], *v[NP];
  make_params(p, m, v);
  for (int i = 0; i < NP; i++) set_grad(p[i], 20 + i, 0);
  double *p0 = tt_test_to_f64(p[0]);
  tt_adamw_config cfg = {1e-3, 0.9, 0.999, 1e-8, 0.0, 0};
  tt_tensor *wrong = NULL;
  cr_assert(tt_tensor_zeros(shapes[0], 2, TT_F32, TT_CPU, &wrong) == 0);
  tt_tensor *keep_v = v[2];
  v[2] = wrong;   /* shaped like p[0], not p[2]: fails after p[0] and p[1] were checked */
  tt_test_assert_error(tt_adamw_step(p, m, v, NP, &cfg, 1),
                       "adamw_step: v[2] f32[7, 13] cpu must be a contiguous f32 tensor shaped "
                       "like params[2] f32[311, 217] cpu");
  tt_test_assert_close(p[0], p0, tt_tensor_numel(p[0]), 0.0, 0.0, "p[0] after a failed step");
  v[2] = keep_v;
  tt_test_assert_error(tt_adamw_step(p, m, v, NP, &cfg, 0), "adamw_step: step is 1-based");
  cfg.beta2 = 1.0;
  tt_test_assert_error(tt_adamw_step(p, m, v, NP, &cfg, 1), "betas in [0, 1)");
  tt_test_assert_error(tt_sgd_step(p, NULL, NP, 0.1, 0.9, 0.0),
                       "sgd_step: momentum 0.9 needs momentum buffers");
  tt_tensor *pt = NULL, *ps[1];
  cr_assert(tt_transpose(p[0], 0, 1, &pt) == 0);
  ps[0] = pt;
  tt_test_assert_error(tt_sgd_step(ps, NULL, 1, 0.1, 0.0, 0.0),
                       "sgd_step: params[0] f32[13, 7] cpu must be a contiguous f32 tensor");
  tt_test_assert_error(tt_clip_grad_norm(p, NP, -1.0, &p0[0]), "max_norm must be >= 0");
  tt_tensor_release(pt);
  tt_tensor_release(wrong);
  free(p0);
  release_all(p, NP);
  release_all(m, NP);
  release_all(v, NP);
}

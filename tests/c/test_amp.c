/*
** test_amp.c — the dynamic loss scaler: its skip / backoff / growth sequence on injected
** overflows (checked against the sequence worked out by hand) and the in-place unscale
** with its inf/NaN check.
*/
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include "core/tt_internal.h"
#include "tetra_amp.h"

/* A leaf param of n values whose grad holds `grad` (copied). */
static tt_tensor *param_with_grad(const double *grad, int64_t n, int dtype) {
  tt_tensor *p = NULL, *g = NULL;
  cr_assert_eq(tt_tensor_zeros(&n, 1, TT_F32, TT_CPU, &p), 0, "%s", tt_last_error());
  cr_assert_eq(tt_set_requires_grad(p, 1), 0);
  cr_assert_eq(tt_tensor_from_f64(grad, &n, 1, dtype, &g), 0, "%s", tt_last_error());
  cr_assert_eq(tt_accumulate_grad(p, g), 0, "%s", tt_last_error());
  tt_tensor_release(g);
  cr_assert_not_null(p->grad);
  return p;
}

Test(amp, defaults) {
  tt_loss_scaler s;
  cr_assert_eq(tt_loss_scaler_init(&s, NULL), 0);
  cr_assert_eq(s.scale, 65536.0);
  cr_assert_eq(s.cfg.growth_factor, 2.0);
  cr_assert_eq(s.cfg.backoff_factor, 0.5);
  cr_assert_eq(s.cfg.growth_interval, 2000);
  tt_loss_scaler_config bad = {.backoff_factor = 1.5};
  cr_assert_eq(tt_loss_scaler_init(&s, &bad), -1);
  cr_assert(strstr(tt_last_error(), "backoff_factor") != NULL, "%s", tt_last_error());
}

/* Injected overflows at steps 3, 7, 8; growth every 3 clean steps.
** step:       1    2    3    4    5    6    7    8    9   10   11   12
** overflow:   -    -    x    -    -    -    x    x    -    -    -    -
** skipped:    0    0    1    0    0    0    1    1    0    0    0    0
** scale after:1024 1024 512  512  512  1024 512  256  256  256  512  512 */
Test(amp, skip_backoff_growth_sequence) {
  tt_loss_scaler_config cfg = {.init_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5,
                               .growth_interval = 3};
  tt_loss_scaler s;
  cr_assert_eq(tt_loss_scaler_init(&s, &cfg), 0, "%s", tt_last_error());
  const int overflow[12] = {0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0};
  const double want_scale[12] = {1024, 1024, 512, 512, 512, 1024,
                                 512, 256, 256, 256, 512, 512};
  for (int step = 0; step < 12; step++) {
    /* The overflow is real: a grad holding inf (or NaN) after backward. */
    double g[3] = {1.0 * s.scale, -2.0 * s.scale, 0.5 * s.scale};
    if (overflow[step]) g[step % 3] = (step % 2) ? INFINITY : NAN;
    tt_tensor *p = param_with_grad(g, 3, TT_F32);
    int found_inf = -1;
    cr_assert_eq(tt_loss_scaler_unscale(&s, &p, 1, &found_inf), 0, "%s", tt_last_error());
    cr_assert_eq(found_inf, overflow[step], "step %d", step + 1);
    if (!found_inf) {
      cr_assert_float_eq(tt_tensor_get(p->grad, 0), 1.0, 1e-7);
      cr_assert_float_eq(tt_tensor_get(p->grad, 1), -2.0, 1e-7);
      cr_assert_float_eq(tt_tensor_get(p->grad, 2), 0.5, 1e-7);
    }
    int skip = tt_loss_scaler_update(&s, found_inf);
    cr_assert_eq(skip, overflow[step], "step %d", step + 1);
    cr_assert_eq(s.last_skipped, overflow[step]);
    cr_assert_eq(s.scale, want_scale[step], "step %d: scale %g, want %g", step + 1, s.scale,
                 want_scale[step]);
    tt_tensor_release(p);
  }
  cr_assert_eq(s.skipped_steps, 3);
  cr_assert_eq(s.steps, 12);
}

Test(amp, scale_stays_within_bounds) {
  tt_loss_scaler_config cfg = {.init_scale = 8, .growth_interval = 1, .min_scale = 2,
                               .max_scale = 64};
  tt_loss_scaler s;
  cr_assert_eq(tt_loss_scaler_init(&s, &cfg), 0);
  for (int i = 0; i < 10; i++) tt_loss_scaler_update(&s, 1);
  cr_assert_eq(s.scale, 2.0);
  for (int i = 0; i < 10; i++) tt_loss_scaler_update(&s, 0);
  cr_assert_eq(s.scale, 64.0);
  cr_assert_eq(s.skipped_steps, 10);
}

Test(amp, unscale_many_params_and_half_grads) {
  const int64_t n = 100000;   /* above the OpenMP grain: the reduction path runs */
  double *g = malloc(sizeof(double) * n);
  cr_assert_not_null(g);
  for (int64_t i = 0; i < n; i++) g[i] = 256.0 * sin(0.001 * (double)i);
  tt_tensor *ps[3] = {param_with_grad(g, n, TT_F32), param_with_grad(g, 7, TT_BF16), NULL};
  int64_t one = 4;
  cr_assert_eq(tt_tensor_zeros(&one, 1, TT_F32, TT_CPU, &ps[2]), 0);   /* no grad: skipped */
  int found_inf = -1;
  cr_assert_eq(tt_grads_unscale_check(ps, 3, 1.0 / 256.0, &found_inf), 0, "%s",
               tt_last_error());
  cr_assert_eq(found_inf, 0);
  for (int64_t i = 0; i < n; i += 997)
    cr_assert_float_eq(tt_tensor_get(ps[0]->grad, i), sin(0.001 * (double)i), 1e-6);
  for (int64_t i = 0; i < 7; i++) {
    /* bf16 keeps 8 significant bits: the reference rounds the same way. */
    double want = tt_bf16_to_float(tt_float_to_bf16((float)g[i])) / 256.0;
    cr_assert_float_eq(tt_tensor_get(ps[1]->grad, i), want, 1e-6);
  }
  tt_tensor_set(ps[0]->grad, n - 1, INFINITY);
  cr_assert_eq(tt_grads_unscale_check(ps, 3, 1.0, &found_inf), 0);
  cr_assert_eq(found_inf, 1);
  for (int i = 0; i < 3; i++) tt_tensor_release(ps[i]);
  free(g);
}

/* -- The f32 master off the device (optimizer offload, tetra_amp.h) ------------------- */

/* A released master: the GEMMs still get its current copy (no read of the master), a
** stale copy is refused with a message instead of a cast from freed memory, and a
** restore gives memory back for the master to be written. */
Test(amp, released_master_keeps_its_copy) {
  const int64_t shape[2] = {3, 4};
  tt_tensor *w = NULL, *copy = NULL, *again = NULL;
  cr_assert_eq(tt_tensor_randn(shape, 2, 0.0, 1.0, &w), 0, "%s", tt_last_error());
  cr_assert_neq(tt_lowp_weight_release_master(w), 0, "a master without a copy was released");
  cr_assert(strstr(tt_last_error(), "no current low-precision copy"), "%s", tt_last_error());
  cr_assert_eq(tt_lowp_weight(w, TT_BF16, &copy), 0, "%s", tt_last_error());
  double want[12], got[12];
  cr_assert_eq(tt_tensor_to_f64(copy, want), 0);
  cr_assert_eq(tt_lowp_weight_release_master(w), 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_resident(w), 0);
  int64_t casts = tt_lowp_weight_casts();
  cr_assert_eq(tt_lowp_weight(w, TT_BF16, &again), 0, "%s", tt_last_error());
  cr_assert_eq(again, copy);
  cr_assert_eq(tt_lowp_weight_casts(), casts, "the current copy was cast again");
  cr_assert_eq(tt_tensor_to_f64(again, got), 0);
  cr_assert_arr_eq(got, want, sizeof want);
  tt_tensor_release(again);
  tt_tensor_bump_version(w);   /* written while away: the copy is stale */
  again = NULL;
  cr_assert_neq(tt_lowp_weight(w, TT_BF16, &again), 0, "a stale copy was cast from nothing");
  cr_assert(strstr(tt_last_error(), "in host memory"), "%s", tt_last_error());
  cr_assert_eq(tt_lowp_weight_restore_master(w), 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_resident(w), 1);
  cr_assert_eq(tt_fill_(w, 0.5), 0);
  cr_assert_eq(tt_lowp_weight(w, TT_BF16, &again), 0, "%s", tt_last_error());
  cr_assert_eq(tt_tensor_to_f64(again, got), 0);
  for (int i = 0; i < 12; i++) cr_assert_eq(got[i], 0.5);
  tt_tensor_release(again);
  tt_tensor_release(copy);
  tt_tensor_release(w);
}

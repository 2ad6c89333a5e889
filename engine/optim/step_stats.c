/*
** step_stats.c — the step's stats tensor (TT_STAT_* in tetra_ops.h): creation, reset,
** what a training step leaves in it besides the gradient norm and clip coefficient
** (engine/optim/optim.c): the loss, fp16's found_inf and the device-side input checks, and
** the one read of it all by the host.
**
** On CUDA the step runs without waiting for the device: the unscale pass writes found_inf
** into the stats, embedding ids and cross-entropy targets are checked on the device
** (tt_cuda_set_deferred_checks), and tt_step_stats_read copies the stats once. A failed
** check is then reported as the op would have reported it.
*/
#include "core/tt_internal.h"
#include "tetra_amp.h"
#include "optim.h"
#include "optim/step_stats.h"
#include <math.h>
#include <string.h>

/* Present only when the CUDA library is linked (kernels/cuda/cast.cu, engine/cuda). */
extern int tt_cuda_unscale_flag(void *data, int dtype, int64_t n, float inv_scale,
                                float *found_inf_dev) __attribute__((weak));
extern int tt_cuda_unscale_flag_dev(void *data, int dtype, int64_t n, const float *inv_dev,
                                    float *found_inf_dev) __attribute__((weak));
extern int tt_cuda_checks_flag(void *dst) __attribute__((weak));
extern int tt_cuda_checks_take(void) __attribute__((weak));

int tt_step_stats_check(const char *op, const tt_tensor *stats, int device) {
  char a[96];
  TT_CHECK(stats, "%s: stats is NULL", op);
  TT_CHECK(stats->dtype == TT_F32 && tt_tensor_is_contiguous(stats) &&
               tt_tensor_numel(stats) == TT_STEP_STATS_N &&
               (device == TT_STATS_ANY_DEVICE || stats->device == device),
           "%s: stats %s must be a contiguous f32 tensor of %d values on the parameters' "
           "device (tt_step_stats_new)", op, tt_tensor_describe(stats, a, sizeof a),
           TT_STEP_STATS_N);
  return 0;
}

int tt_step_stats_new(int device, tt_tensor **out) {
  TT_CHECK(out, "step_stats_new: out is NULL");
  int64_t n = TT_STEP_STATS_N;
  tt_tensor *t = NULL;
  TT_TRY(tt_tensor_zeros(&n, 1, TT_F32, device, &t));
  int rc = tt_step_stats_reset(t);
  if (rc == 0) {   /* the update slots: NaN (an update that reads them unset writes NaN) */
    const tt_optim_kernels *k = TT_KERNELS(tt_optim, device);
    rc = k && k->fill ? k->fill((float *)tt_tensor_data(t) + TT_STAT_LR,
                                TT_STEP_STATS_N - TT_STAT_LR, NAN)
                      : tt_no_kernel("step_stats_new", device);
  }
  if (rc) {
    tt_tensor_release(t);
    return rc;
  }
  *out = t;
  return 0;
}

/* By a kernel on CUDA (tt_fill_ would copy from the host and wait). */
int tt_step_stats_reset(tt_tensor *stats) {
  TT_TRY(tt_step_stats_check("step_stats_reset", stats, TT_STATS_ANY_DEVICE));
  const tt_optim_kernels *k = TT_KERNELS(tt_optim, stats->device);
  if (!k || !k->fill) return tt_no_kernel("step_stats_reset", stats->device);
  float *s = tt_tensor_data(stats);
  TT_TRY(k->fill(s, TT_STAT_LR, 0.0f));
  return k->fill(s + TT_STAT_GRAD_SCALE, 1, 1.0f);
}

/* stats[first + i] = values[i] for i < n: the host-set slots, by the fill kernel (no
** wait on CUDA). The stats were checked by the caller. */
static int write_slots(const char *op, tt_tensor *stats, int first, const float *values,
                       int n) {
  const tt_optim_kernels *k = TT_KERNELS(tt_optim, stats->device);
  if (!k || !k->fill) return tt_no_kernel(op, stats->device);
  float *s = tt_tensor_data(stats);
  for (int i = 0; i < n; i++) TT_TRY(k->fill(s + first + i, 1, values[i]));
  return 0;
}

int tt_step_stats_set_update(tt_tensor *stats, double lr, double beta1, double beta2,
                             int64_t step) {
  const char *op = "step_stats_set_update";
  TT_TRY(tt_step_stats_check(op, stats, TT_STATS_ANY_DEVICE));
  TT_CHECK(lr >= 0.0 && beta1 >= 0.0 && beta1 < 1.0 && beta2 >= 0.0 && beta2 < 1.0 &&
               step >= 1,
           "%s: need lr >= 0, betas in [0, 1) and step >= 1 (got lr %g, betas (%g, %g), "
           "step %lld)", op, lr, beta1, beta2, (long long)step);
  const float v[3] = {(float)lr, (float)(1.0 - pow(beta1, (double)step)),
                      (float)(1.0 - pow(beta2, (double)step))};
  return write_slots(op, stats, TT_STAT_LR, v, 3);   /* LR, BC1, BC2 */
}

int tt_step_stats_set_loss(tt_tensor *stats, tt_tensor *loss) {
  const char *op = "step_stats_set_loss";
  TT_TRY(tt_step_stats_check(op, stats, TT_STATS_ANY_DEVICE));
  TT_CHECK(loss && tt_tensor_numel(loss) == 1 && loss->device == stats->device,
           "%s: the loss must be one value on the stats' device", op);
  tt_tensor *slot = NULL;
  TT_TRY(tt_narrow(stats, 0, TT_STAT_LOSS, 1, &slot));
  tt_tensor *flat = NULL;
  int64_t one = 1;
  int rc = tt_view(loss, &one, 1, &flat);
  if (rc == 0) rc = tt_copy_(slot, flat);
  /* A loss that is not finite, or above the spike limit, skips the update, as a gradient
  ** that is not finite would: found_inf (and the spike flag), set on the device. */
  float *s = tt_tensor_data(stats);
  if (rc == 0) {
    const tt_optim_kernels *k = TT_KERNELS(tt_optim, stats->device);
    rc = k && k->loss_flags ? k->loss_flags(s + TT_STAT_LOSS, s + TT_STAT_LOSS_LIMIT,
                                            s + TT_STAT_FOUND_INF, s + TT_STAT_SPIKE)
                            : tt_no_kernel(op, stats->device);
  }
  tt_tensor_release(flat);
  tt_tensor_release(slot);
  return rc;
}

int tt_step_stats_set_scale(tt_tensor *stats, double scale) {
  const char *op = "step_stats_set_scale";
  TT_TRY(tt_step_stats_check(op, stats, TT_STATS_ANY_DEVICE));
  TT_CHECK(scale > 0.0 && isfinite(scale), "%s: the loss scale must be finite and > 0 (got %g)",
           op, scale);
  const float v[2] = {(float)scale, (float)(1.0 / scale)};
  return write_slots(op, stats, TT_STAT_LOSS_SCALE, v, 2);   /* LOSS_SCALE, INV_SCALE */
}

int tt_step_stats_set_loss_limit(tt_tensor *stats, double limit) {
  const char *op = "step_stats_set_loss_limit";
  TT_TRY(tt_step_stats_check(op, stats, TT_STATS_ANY_DEVICE));
  TT_CHECK(!isnan(limit), "%s: the limit is NaN (+inf for no spike check)", op);
  const float v = (float)limit;
  return write_slots(op, stats, TT_STAT_LOSS_LIMIT, &v, 1);
}

/* The grads of params divided by the scale: inv_scale, or on CUDA with by_stats the
** stats' TT_STAT_INV_SCALE read by the kernels (the CPU reads it at once). */
static int unscale_to_stats(const char *op, tt_tensor *const *params, int n, double inv_scale,
                            int by_stats, tt_tensor *stats) {
  TT_TRY(tt_step_stats_check(op, stats, TT_STATS_ANY_DEVICE));
  float *s = tt_tensor_data(stats);
  if (!tt_device_is_cuda(stats->device)) {
    int found = 0;
    if (by_stats) inv_scale = s[TT_STAT_INV_SCALE];
    TT_CHECK(inv_scale > 0.0 && isfinite(inv_scale), "%s: the inverse loss scale is %g (the "
             "stats' scale is unset: tt_step_stats_set_scale first)", op, inv_scale);
    TT_TRY(tt_grads_unscale_check(params, n, inv_scale, &found));
    if (found) s[TT_STAT_FOUND_INF] = 1.0f;
    return 0;
  }
  if (!(by_stats ? (void *)tt_cuda_unscale_flag_dev : (void *)tt_cuda_unscale_flag))
    return tt_no_kernel(op, stats->device);
  TT_CHECK(n >= 0 && (n == 0 || params), "%s: bad parameter list", op);
  for (int i = 0; i < n; i++) {
    tt_tensor *g = params[i] ? params[i]->grad : NULL;
    if (!g) continue;
    TT_CHECK(tt_tensor_is_contiguous(g) && g->device == stats->device,
             "%s: grad of param %d must be contiguous and on the stats' device", op, i);
    if (by_stats)
      TT_TRY(tt_cuda_unscale_flag_dev(tt_tensor_data(g), g->dtype, tt_tensor_numel(g),
                                      s + TT_STAT_INV_SCALE, s + TT_STAT_FOUND_INF));
    else
      TT_TRY(tt_cuda_unscale_flag(tt_tensor_data(g), g->dtype, tt_tensor_numel(g),
                                  (float)inv_scale, s + TT_STAT_FOUND_INF));
  }
  return 0;
}

int tt_grads_unscale_to_stats(tt_tensor *const *params, int n, double inv_scale,
                              tt_tensor *stats) {
  return unscale_to_stats("unscale grads", params, n, inv_scale, 0, stats);
}

int tt_grads_unscale_by_stats(tt_tensor *const *params, int n, tt_tensor *stats) {
  return unscale_to_stats("unscale grads", params, n, 0.0, 1, stats);
}

int tt_step_stats_read(tt_tensor *stats, float *out) {
  const char *op = "step_stats_read";
  TT_TRY(tt_step_stats_check(op, stats, TT_STATS_ANY_DEVICE));
  TT_CHECK(out, "%s: out is NULL", op);
  int cuda = tt_device_is_cuda(stats->device);
  if (cuda && tt_cuda_checks_flag)   /* also after the checks were turned off again */
    TT_TRY(tt_cuda_checks_flag((float *)tt_tensor_data(stats) + TT_STAT_ERRORS));
  if (cuda) {
    const tt_device_backend *b = tt_backend_for(stats->device);
    if (!b) return -1;
    TT_TRY(b->memcpy(out, TT_CPU, tt_tensor_data(stats), stats->device,
                     sizeof(float) * TT_STEP_STATS_N));
  } else {
    memcpy(out, tt_tensor_data(stats), sizeof(float) * TT_STEP_STATS_N);
  }
  if (out[TT_STAT_ERRORS] != 0.0f && cuda && tt_cuda_checks_take) return tt_cuda_checks_take();
  return 0;
}

/*
** amp.c — the dynamic loss scaler for fp16 training.
**
** fp16 gradients underflow below 6e-8, so the loss is multiplied by a large scale before
** backward and the gradients divided by it before the optimizer. The scale adapts: a
** step whose gradients hold inf or NaN is skipped and the scale backed off; after
** growth_interval clean steps the scale grows again. The same sequence as
** torch.cuda.amp.GradScaler, so recipes tuned there behave alike here.
*/
#include "core/tt_internal.h"
#include "tetra_amp.h"
#include "tt_cuda_ops.h"
#include <math.h>

/* Present only when the CUDA library is linked (kernels/cuda/cast.cu). */
extern int tt_cuda_unscale_check(void *data, int dtype, int64_t n, float inv_scale,
                                 int *found_inf) __attribute__((weak));

/* -- Scaler ------------------------------------------------------------------------- */

int tt_loss_scaler_init(tt_loss_scaler *s, const tt_loss_scaler_config *cfg) {
  TT_CHECK(s != NULL, "tt_loss_scaler_init: scaler is NULL");
  memset(s, 0, sizeof(*s));
  if (cfg) s->cfg = *cfg;
  tt_loss_scaler_config *c = &s->cfg;
  if (c->init_scale == 0) c->init_scale = 65536.0;
  if (c->growth_factor == 0) c->growth_factor = 2.0;
  if (c->backoff_factor == 0) c->backoff_factor = 0.5;
  if (c->growth_interval == 0) c->growth_interval = 2000;
  if (c->min_scale == 0) c->min_scale = 1.0;
  if (c->max_scale == 0) c->max_scale = 16777216.0;
  TT_CHECK(c->init_scale > 0 && isfinite(c->init_scale),
           "loss scaler: init_scale must be a positive number, got %g", c->init_scale);
  TT_CHECK(c->growth_factor >= 1, "loss scaler: growth_factor must be >= 1, got %g",
           c->growth_factor);
  TT_CHECK(c->backoff_factor > 0 && c->backoff_factor < 1,
           "loss scaler: backoff_factor must be in (0, 1), got %g", c->backoff_factor);
  TT_CHECK(c->growth_interval > 0, "loss scaler: growth_interval must be > 0, got %lld",
           (long long)c->growth_interval);
  TT_CHECK(c->min_scale > 0 && c->min_scale <= c->max_scale,
           "loss scaler: need 0 < min_scale <= max_scale, got %g and %g", c->min_scale,
           c->max_scale);
  s->scale = fmin(fmax(c->init_scale, c->min_scale), c->max_scale);
  return 0;
}

int tt_loss_scaler_unscale(const tt_loss_scaler *s, tt_tensor *const *params, int n,
                           int *found_inf) {
  TT_CHECK(s != NULL && s->scale > 0, "tt_loss_scaler_unscale: scaler not initialised");
  return tt_grads_unscale_check(params, n, 1.0 / s->scale, found_inf);
}

int tt_loss_scaler_update(tt_loss_scaler *s, int found_inf) {
  const tt_loss_scaler_config *c = &s->cfg;
  s->steps++;
  if (found_inf) {
    s->scale = fmax(s->scale * c->backoff_factor, c->min_scale);
    s->good_steps = 0;
    s->skipped_steps++;
    s->last_skipped = 1;
    return 1;
  }
  s->last_skipped = 0;
  if (++s->good_steps >= c->growth_interval) {
    s->scale = fmin(s->scale * c->growth_factor, c->max_scale);
    s->good_steps = 0;
  }
  return 0;
}

/* -- Unscale and check -------------------------------------------------------------- */

/* Scales n values in place; returns 1 when one was inf or NaN. */
static int unscale_f32(float *g, int64_t n, float inv) {
  int bad = 0;
  #pragma omp parallel for reduction(|:bad) if(n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    float v = g[i];
    bad |= !isfinite(v);
    g[i] = v * inv;
  }
  return bad;
}

static int unscale_half(uint16_t *g, int64_t n, float inv, int bf16) {
  int bad = 0;
  #pragma omp parallel for reduction(|:bad) if(n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    float v = bf16 ? tt_bf16_to_float(g[i]) : tt_f16_to_float(g[i]);
    bad |= !isfinite(v);
    v *= inv;
    g[i] = bf16 ? tt_float_to_bf16(v) : tt_float_to_f16(v);
  }
  return bad;
}

int tt_grads_unscale_check(tt_tensor *const *params, int n, double inv_scale,
                           int *found_inf) {
  TT_CHECK(found_inf != NULL, "unscale grads: found_inf is NULL");
  TT_CHECK(n >= 0 && (n == 0 || params != NULL), "unscale grads: bad parameter list");
  *found_inf = 0;
  float inv = (float)inv_scale;
  for (int i = 0; i < n; i++) {
    tt_tensor *g = params[i] ? params[i]->grad : NULL;
    if (!g) continue;
    TT_CHECK(tt_tensor_is_contiguous(g), "unscale grads: grad of param %d is not contiguous",
             i);
    TT_CHECK(g->dtype == TT_F32 || g->dtype == TT_BF16 || g->dtype == TT_F16,
             "unscale grads: grad of param %d has dtype %s (want f32, bf16 or f16)", i,
             tt_dtype_name(g->dtype));
    int64_t numel = tt_tensor_numel(g);
    void *data = tt_tensor_data(g);
    if (tt_device_is_cuda(g->device)) {
      if (!tt_cuda_unscale_check) return tt_no_kernel("unscale grads", g->device);
      TT_TRY(tt_cuda_unscale_check(data, g->dtype, numel, inv, found_inf));
    } else if (g->dtype == TT_F32) {
      *found_inf |= unscale_f32(data, numel, inv);
    } else {
      *found_inf |= unscale_half(data, numel, inv, g->dtype == TT_BF16);
    }
  }
  return 0;
}

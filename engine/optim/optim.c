/*
** ops_optim.c — fused optimizer steps and gradient-norm utilities over lists of
** parameters: tt_adamw_step, tt_sgd_step, tt_grad_norm, tt_clip_grad_norm, and the
** multi-tensor forms that keep a step's scalars on the device (tt_grad_sumsq,
** tt_clip_finish, tt_adamw_multi; the stats tensor itself is engine/optim/step_stats.c's).
**
** Not differentiable: they update tensors in place outside the tape. Every argument of
** every parameter is validated before the first one is touched, so a bad list fails
** without a half-applied step. Parameters and optimizer state must be contiguous f32
** (they are written through raw pointers); a strided gradient is copied first.
*/
#include "core/tt_internal.h"
#include "optim.h"
#include "optim/step_stats.h"
#include <math.h>

/* `state` (m, v or a momentum buffer) must be f32, contiguous, shaped and placed like p. */
static int check_state(const char *op, const char *what, int i, const tt_tensor *p,
                       const tt_tensor *state) {
  char a[96], b[96];
  if (!state) return tt_set_error("%s: %s[%d] is NULL", op, what, i);
  int ok = state->dtype == TT_F32 && state->device == p->device &&
           state->ndim == p->ndim && tt_tensor_is_contiguous(state);
  for (int d = 0; ok && d < p->ndim; d++) ok = state->shape[d] == p->shape[d];
  if (!ok)
    return tt_set_error("%s: %s[%d] %s must be a contiguous f32 tensor shaped like "
                        "params[%d] %s", op, what, i,
                        tt_tensor_describe(state, a, sizeof a), i,
                        tt_tensor_describe(p, b, sizeof b));
  return 0;
}

/* Parameter i must be contiguous f32, and its grad (when present) f32 of the same shape
** on the same device. */
static int check_param(const char *op, int i, const tt_tensor *p) {
  char a[96], b[96];
  if (!p) return tt_set_error("%s: params[%d] is NULL", op, i);
  if (p->dtype != TT_F32 || !tt_tensor_is_contiguous(p))
    return tt_set_error("%s: params[%d] %s must be a contiguous f32 tensor", op, i,
                        tt_tensor_describe(p, a, sizeof a));
  const tt_tensor *g = p->grad;
  if (!g) return 0;
  int ok = g->dtype == TT_F32 && g->device == p->device && g->ndim == p->ndim;
  for (int d = 0; ok && d < p->ndim; d++) ok = g->shape[d] == p->shape[d];
  if (!ok)
    return tt_set_error("%s: params[%d] %s has a grad %s of another shape, dtype or device",
                        op, i, tt_tensor_describe(p, a, sizeof a),
                        tt_tensor_describe(g, b, sizeof b));
  return 0;
}

/* -- AdamW ---------------------------------------------------------------------------- */

/* The hyperparameters every AdamW entry accepts. */
static int check_adamw_cfg(const char *op, const tt_adamw_config *cfg, int64_t step) {
  TT_CHECK(cfg, "%s: cfg must not be NULL", op);
  TT_CHECK(step >= 1, "%s: step is 1-based (got %lld)", op, (long long)step);
  TT_CHECK(cfg->lr >= 0.0 && cfg->eps >= 0.0 && cfg->weight_decay >= 0.0 &&
               cfg->beta1 >= 0.0 && cfg->beta1 < 1.0 && cfg->beta2 >= 0.0 &&
               cfg->beta2 < 1.0,
           "%s: need lr >= 0, eps >= 0, weight_decay >= 0 and betas in [0, 1) (got lr %g, "
           "betas (%g, %g), eps %g, weight_decay %g)", op, cfg->lr, cfg->beta1, cfg->beta2,
           cfg->eps, cfg->weight_decay);
  return 0;
}

int tt_adamw_step(tt_tensor *const *params, tt_tensor *const *m, tt_tensor *const *v,
                  int n, const tt_adamw_config *cfg, int64_t step) {
  const char *op = "adamw_step";
  TT_CHECK(n >= 0 && (n == 0 || (params && m && v)),
           "%s: params, m and v must be arrays of n = %d tensors", op, n);
  TT_TRY(check_adamw_cfg(op, cfg, step));
  for (int i = 0; i < n; i++) {
    TT_TRY(check_param(op, i, params[i]));
    if (!params[i]->grad) continue;
    TT_TRY(check_state(op, "m", i, params[i], m[i]));
    TT_TRY(check_state(op, "v", i, params[i], v[i]));
  }
  double bc1 = 1.0 - pow(cfg->beta1, (double)step);
  double bc2 = 1.0 - pow(cfg->beta2, (double)step);
  for (int i = 0; i < n; i++) {
    tt_tensor *p = params[i], *g = NULL;
    if (!p->grad) continue;
    const tt_optim_kernels *k = TT_KERNELS(tt_optim, p->device);
    if (!k || !k->adamw) return tt_no_kernel(op, p->device);
    TT_TRY(tt_contiguous_nograd(p->grad, &g));
    int rc = k->adamw(tt_tensor_data(p), tt_tensor_data(g), tt_tensor_data(m[i]),
                      tt_tensor_data(v[i]), tt_tensor_numel(p), (float)cfg->lr,
                      (float)cfg->beta1, (float)cfg->beta2, (float)cfg->eps,
                      (float)cfg->weight_decay, (float)bc1, (float)bc2);
    tt_tensor_release(g);
    TT_TRY(rc);
  }
  return 0;
}

/* -- SGD with momentum ---------------------------------------------------------------- */

int tt_sgd_step(tt_tensor *const *params, tt_tensor *const *momentum, int n, double lr,
                double mu, double weight_decay) {
  const char *op = "sgd_step";
  TT_CHECK(n >= 0 && (n == 0 || params), "%s: params must be an array of n = %d tensors",
           op, n);
  TT_CHECK(lr >= 0.0 && mu >= 0.0 && weight_decay >= 0.0,
           "%s: need lr, momentum and weight_decay >= 0 (got %g, %g, %g)", op, lr, mu,
           weight_decay);
  TT_CHECK(mu == 0.0 || momentum, "%s: momentum %g needs momentum buffers", op, mu);
  for (int i = 0; i < n; i++) {
    TT_TRY(check_param(op, i, params[i]));
    if (params[i]->grad && mu != 0.0) TT_TRY(check_state(op, "momentum", i, params[i],
                                                         momentum[i]));
  }
  for (int i = 0; i < n; i++) {
    tt_tensor *p = params[i], *g = NULL;
    if (!p->grad) continue;
    const tt_optim_kernels *k = TT_KERNELS(tt_optim, p->device);
    if (!k || !k->sgd) return tt_no_kernel(op, p->device);
    TT_TRY(tt_contiguous_nograd(p->grad, &g));
    int rc = k->sgd(tt_tensor_data(p), tt_tensor_data(g),
                    mu != 0.0 ? tt_tensor_data(momentum[i]) : NULL, tt_tensor_numel(p),
                    (float)lr, (float)mu, (float)weight_decay);
    tt_tensor_release(g);
    TT_TRY(rc);
  }
  return 0;
}

/* -- Gradient norm and clipping ------------------------------------------------------- */

int tt_grad_norm(tt_tensor *const *params, int n, double *out) {
  const char *op = "grad_norm";
  TT_CHECK(out, "%s: out must not be NULL", op);
  TT_CHECK(n >= 0 && (n == 0 || params), "%s: params must be an array of n = %d tensors",
           op, n);
  for (int i = 0; i < n; i++) {
    TT_CHECK(params[i], "%s: params[%d] is NULL", op, i);
    const tt_tensor *g = params[i]->grad;
    if (g) TT_TRY(tt_check_dtype(op, "grad", g, TT_F32));
  }
  double total = 0.0;
  for (int i = 0; i < n; i++) {
    tt_tensor *g = NULL;
    if (!params[i]->grad) continue;
    const tt_optim_kernels *k = TT_KERNELS(tt_optim, params[i]->device);
    if (!k || !k->sum_squares) return tt_no_kernel(op, params[i]->device);
    TT_TRY(tt_contiguous_nograd(params[i]->grad, &g));
    double s = 0.0;
    int rc = k->sum_squares(tt_tensor_data(g), tt_tensor_numel(g), &s);
    tt_tensor_release(g);
    TT_TRY(rc);
    total += s;
  }
  *out = sqrt(total);
  return 0;
}

/* Grads are scaled in place; a strided grad is scaled in a contiguous copy that is then
** copied back. A non-finite norm leaves the grads untouched: the caller sees it in
** *out_norm and skips the step. */
int tt_clip_grad_norm(tt_tensor *const *params, int n, double max_norm, double *out_norm) {
  const char *op = "clip_grad_norm";
  TT_CHECK(out_norm, "%s: out_norm must not be NULL", op);
  TT_CHECK(max_norm >= 0.0, "%s: max_norm must be >= 0 (got %g)", op, max_norm);
  double norm;
  TT_TRY(tt_grad_norm(params, n, &norm));
  *out_norm = norm;
  double coef = max_norm / (norm + 1e-6);
  if (!isfinite(norm) || coef >= 1.0) return 0;
  for (int i = 0; i < n; i++) {
    tt_tensor *grad = params[i]->grad, *g = NULL;
    if (!grad) continue;
    const tt_optim_kernels *k = TT_KERNELS(tt_optim, grad->device);
    if (!k || !k->scale) return tt_no_kernel(op, grad->device);
    TT_TRY(tt_contiguous_nograd(grad, &g));
    int rc = k->scale(tt_tensor_data(g), tt_tensor_numel(g), (float)coef);
    if (rc == 0 && g != grad) rc = tt_copy_(grad, g);
    tt_tensor_release(g);
    TT_TRY(rc);
  }
  return 0;
}

/* -- Multi-tensor forms: the step's scalars stay on the device ------------------------ */

/* The grads of the params that have one, made contiguous (*owned[i] set when a copy was
** taken: the caller releases those), with their data pointers and sizes. */
static int gather_grads(const char *op, tt_tensor *const *params, int n, int device,
                        tt_tensor **owned, const float **data, int64_t *numel, int *count) {
  *count = 0;
  for (int i = 0; i < n; i++) {
    TT_CHECK(params[i], "%s: params[%d] is NULL", op, i);
    tt_tensor *grad = params[i]->grad, *g = NULL;
    if (!grad) continue;
    TT_TRY(tt_check_dtype(op, "grad", grad, TT_F32));
    TT_CHECK(grad->device == device, "%s: params[%d]'s grad is on device %d, the others on "
             "%d (one list per device)", op, i, grad->device, device);
    TT_TRY(tt_contiguous_nograd(grad, &g));
    owned[*count] = g;
    data[*count] = tt_tensor_data(g);
    numel[*count] = tt_tensor_numel(g);
    (*count)++;
  }
  return 0;
}

static void release_all(tt_tensor **t, int n) {
  for (int i = 0; i < n; i++) tt_tensor_release(t[i]);
}

int tt_grad_sumsq(tt_tensor *const *params, int n, tt_tensor *stats) {
  const char *op = "grad_sumsq";
  TT_CHECK(n >= 0 && (n == 0 || params), "%s: params must be an array of n = %d tensors",
           op, n);
  TT_TRY(tt_step_stats_check(op, stats, TT_STATS_ANY_DEVICE));
  const tt_optim_kernels *k = TT_KERNELS(tt_optim, stats->device);
  if (!k || !k->sum_squares_multi) return tt_no_kernel(op, stats->device);
  tt_tensor **owned = calloc((size_t)n + 1, sizeof *owned);
  const float **data = calloc((size_t)n + 1, sizeof *data);
  int64_t *numel = calloc((size_t)n + 1, sizeof *numel);
  int count = 0, rc = -1;
  if (!owned || !data || !numel) {
    tt_set_error("%s: out of host memory for %d tensors", op, n);
  } else {
    rc = gather_grads(op, params, n, stats->device, owned, data, numel, &count);
    if (rc == 0)
      rc = k->sum_squares_multi(data, numel, count,
                                (float *)tt_tensor_data(stats) + TT_STAT_SUMSQ_HI);
  }
  if (owned) release_all(owned, count);
  free(owned);
  free((void *)data);
  free(numel);
  return rc;
}

int tt_clip_finish(tt_tensor *stats, tt_tensor *gathered, double replicas, double max_norm) {
  const char *op = "clip_finish";
  char a[96];
  TT_TRY(tt_step_stats_check(op, stats, TT_STATS_ANY_DEVICE));
  TT_CHECK(replicas >= 1.0, "%s: replicas must be >= 1 (got %g)", op, replicas);
  TT_CHECK(max_norm >= 0.0, "%s: max_norm must be >= 0 (got %g)", op, max_norm);
  float *s = tt_tensor_data(stats);
  const float *pairs = s + TT_STAT_SUMSQ_HI;
  int parts = 1;
  if (gathered) {
    int64_t n = tt_tensor_numel(gathered);
    TT_CHECK(gathered->dtype == TT_F32 && tt_tensor_is_contiguous(gathered) && n >= 2 &&
                 n % 2 == 0 && n / 2 <= 0x7fffffff && gathered->device == stats->device,
             "%s: gathered %s must be a contiguous f32 tensor of (hi, lo) pairs on the "
             "stats' device", op, tt_tensor_describe(gathered, a, sizeof a));
    pairs = tt_tensor_data(gathered);
    parts = (int)(n / 2);
  }
  const tt_optim_kernels *k = TT_KERNELS(tt_optim, stats->device);
  if (!k || !k->clip_finish) return tt_no_kernel(op, stats->device);
  return k->clip_finish(pairs, parts, s + TT_STAT_GRAD_NORM, s + TT_STAT_GRAD_SCALE,
                        s + TT_STAT_FOUND_INF, replicas, max_norm);
}

/* bf16[i] (when given) must be a contiguous bf16 tensor of params[i]'s numel beside it. */
static int check_bf16_copy(const char *op, int i, const tt_tensor *p, const tt_tensor *b) {
  char a[96], c[96];
  if (b->dtype == TT_BF16 && tt_tensor_is_contiguous(b) && b->device == p->device &&
      tt_tensor_numel(b) == tt_tensor_numel(p))
    return 0;
  return tt_set_error("%s: bf16[%d] %s must be a contiguous bf16 tensor of the numel of "
                      "params[%d] %s, on its device", op, i,
                      tt_tensor_describe(b, a, sizeof a), i,
                      tt_tensor_describe(p, c, sizeof c));
}

/* Every argument of tt_adamw_multi, before anything is written; *device: the list's. */
static int check_adamw_multi(const char *op, tt_tensor *const *params, tt_tensor *const *m,
                             tt_tensor *const *v, tt_tensor *const *bf16, int n,
                             const tt_tensor *stats, int *device) {
  *device = stats ? stats->device : (n > 0 && params[0] ? params[0]->device : 0);
  for (int i = 0; i < n; i++) {
    TT_TRY(check_param(op, i, params[i]));
    TT_CHECK(params[i]->device == *device, "%s: params[%d] is on device %d, params[0] (or "
             "stats) on %d: one list per device", op, i, params[i]->device, *device);
    if (!params[i]->grad) continue;
    TT_TRY(check_state(op, "m", i, params[i], m[i]));
    TT_TRY(check_state(op, "v", i, params[i], v[i]));
    if (bf16 && bf16[i]) TT_TRY(check_bf16_copy(op, i, params[i], bf16[i]));
  }
  return stats ? tt_step_stats_check(op, stats, *device) : 0;
}

int tt_adamw_multi(tt_tensor *const *params, tt_tensor *const *m, tt_tensor *const *v,
                   tt_tensor *const *bf16, int n, const tt_adamw_config *cfg, int64_t step,
                   tt_tensor *stats) {
  const char *op = "adamw_multi";
  TT_CHECK(n >= 0 && (n == 0 || (params && m && v)),
           "%s: params, m and v must be arrays of n = %d tensors", op, n);
  TT_TRY(check_adamw_cfg(op, cfg, step));
  int device;
  TT_TRY(check_adamw_multi(op, params, m, v, bf16, n, stats, &device));
  TT_CHECK(!cfg->lr_from_stats || stats, "%s: lr_from_stats needs the stats tensor", op);
  if (cfg->lr_from_stats && !tt_device_is_cuda(device)) {   /* CUDA: NaN weights show it */
    const float *s = tt_tensor_data(stats);
    TT_CHECK(isfinite(s[TT_STAT_LR]) && s[TT_STAT_BC1] > 0.0f && s[TT_STAT_BC2] > 0.0f,
             "%s: lr_from_stats, but the stats' update slots are unset "
             "(tt_step_stats_set_update before the update)", op);
  }
  const tt_optim_kernels *k = TT_KERNELS(tt_optim, device);
  if (!k || !k->adamw_multi) return tt_no_kernel(op, device);
  size_t cap = (size_t)n + 1;
  tt_tensor **owned = calloc(cap, sizeof *owned);
  const float **g = calloc(cap, sizeof *g);
  int64_t *numel = calloc(cap, sizeof *numel);
  float **p = calloc(cap, sizeof *p), **mm = calloc(cap, sizeof *mm), **vv = calloc(cap, sizeof *vv);
  uint16_t **b = calloc(cap, sizeof *b);
  int count = 0, rc = -1;
  if (!owned || !g || !numel || !p || !mm || !vv || !b) {
    tt_set_error("%s: out of host memory for %d tensors", op, n);
  } else if ((rc = gather_grads(op, params, n, device, owned, g, numel, &count)) == 0) {
    for (int i = 0, j = 0; i < n; i++) {
      if (!params[i]->grad) continue;
      p[j] = tt_tensor_data(params[i]);
      mm[j] = tt_tensor_data(m[i]);
      vv[j] = tt_tensor_data(v[i]);
      b[j] = bf16 && bf16[i] ? tt_tensor_data(bf16[i]) : NULL;
      j++;
    }
    float *s = stats ? tt_tensor_data(stats) : NULL;
    tt_adamw_multi_args a = {
      .p = p, .g = g, .m = mm, .v = vv, .bf16 = b, .n = numel, .count = count,
      .lr = (float)cfg->lr, .beta1 = (float)cfg->beta1, .beta2 = (float)cfg->beta2,
      .eps = (float)cfg->eps, .weight_decay = (float)cfg->weight_decay,
      .bc1 = (float)(1.0 - pow(cfg->beta1, (double)step)),
      .bc2 = (float)(1.0 - pow(cfg->beta2, (double)step)),
      .grad_scale = s ? s + TT_STAT_GRAD_SCALE : NULL,
      .found_inf = s ? s + TT_STAT_FOUND_INF : NULL,
      .hyper = cfg->lr_from_stats ? s + TT_STAT_LR : NULL,
    };
    rc = k->adamw_multi(&a);
  }
  if (owned) release_all(owned, count);
  free(owned);
  free((void *)g);
  free(numel);
  free(p);
  free(mm);
  free(vv);
  free(b);
  return rc;
}

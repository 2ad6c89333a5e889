/*
** ops_optim.c — fused optimizer steps and gradient-norm utilities over lists of
** parameters: tt_adamw_step, tt_sgd_step, tt_grad_norm, tt_clip_grad_norm.
**
** Not differentiable: they update tensors in place outside the tape. Every argument of
** every parameter is validated before the first one is touched, so a bad list fails
** without a half-applied step. Parameters and optimizer state must be contiguous f32
** (they are written through raw pointers); a strided gradient is copied first.
*/
#include "tt_internal.h"
#include "optim.h"
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

int tt_adamw_step(tt_tensor *const *params, tt_tensor *const *m, tt_tensor *const *v,
                  int n, const tt_adamw_config *cfg, int64_t step) {
  const char *op = "adamw_step";
  TT_CHECK(n >= 0 && (n == 0 || (params && m && v)),
           "%s: params, m and v must be arrays of n = %d tensors", op, n);
  TT_CHECK(cfg, "%s: cfg must not be NULL", op);
  TT_CHECK(step >= 1, "%s: step is 1-based (got %lld)", op, (long long)step);
  TT_CHECK(cfg->lr >= 0.0 && cfg->eps >= 0.0 && cfg->weight_decay >= 0.0 &&
               cfg->beta1 >= 0.0 && cfg->beta1 < 1.0 && cfg->beta2 >= 0.0 &&
               cfg->beta2 < 1.0,
           "%s: need lr >= 0, eps >= 0, weight_decay >= 0 and betas in [0, 1) (got lr %g, "
           "betas (%g, %g), eps %g, weight_decay %g)", op, cfg->lr, cfg->beta1, cfg->beta2,
           cfg->eps, cfg->weight_decay);
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

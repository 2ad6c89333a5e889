/*
** optim.c — CPU kernels of the fused optimizer updates and the gradient norm.
**
** The updates are elementwise, one pass over p, g and the state (memory-bound: the fused
** AdamW reads 4 and writes 3 floats per parameter), split across threads in static
** chunks and vectorised. The sum of squares splits a tensor into a fixed number of
** contiguous ranges whatever the thread count, and adds the range totals in order, so
** the norm is reproducible bit for bit.
**
** The multi-tensor entries are the CPU twins of the CUDA ones: the same loops over a list,
** with the per-step scalars (gradient scale, found_inf, sum of squares, norm) in plain
** memory.
*/
#include "optim.h"
#include "kernel.h"
#include <math.h>

enum { SUMSQ_RANGES = 64 };

/* One tensor's AdamW; g is multiplied by gscale first unless gscale is NULL, and the new
** p is also stored rounded to bf16 in bf16 unless that is NULL. adamw and adamw_multi
** both run this loop, so their results are the same bits. */
static void adamw_tensor(float *p, const float *g, float *m, float *v, uint16_t *bf16,
                         int64_t n, const float *gscale, float lr, float beta1, float beta2,
                         float eps, float weight_decay, float bc1, float bc2) {
  float decay = 1.0f - lr * weight_decay, step = lr / bc1, inv_sqrt_bc2 = 1.0f / sqrtf(bc2);
  float s = gscale ? *gscale : 1.0f;
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    float gi = gscale ? g[i] * s : g[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i] * decay - step * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    p[i] = pi;
    if (bf16) bf16[i] = tt_elem_float_to_bf16(pi);
  }
}

static int adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                 float beta1, float beta2, float eps, float weight_decay, float bc1,
                 float bc2) {
  adamw_tensor(p, g, m, v, NULL, n, NULL, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
  return 0;
}

static int adamw_multi(const tt_adamw_multi_args *a) {
  if (a->found_inf && *a->found_inf != 0.0f) return 0;
  float lr = a->hyper ? a->hyper[0] : a->lr, bc1 = a->hyper ? a->hyper[1] : a->bc1,
        bc2 = a->hyper ? a->hyper[2] : a->bc2;
  for (int t = 0; t < a->count; t++)
    adamw_tensor(a->p[t], a->g[t], a->m[t], a->v[t], a->bf16 ? a->bf16[t] : NULL, a->n[t],
                 a->grad_scale, lr, a->beta1, a->beta2, a->eps, a->weight_decay, bc1, bc2);
  return 0;
}

static int sgd(float *p, const float *g, float *buf, int64_t n, float lr, float mu,
               float weight_decay) {
  if (buf) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t i = 0; i < n; i++) {
      float b = mu * buf[i] + g[i] + weight_decay * p[i];
      buf[i] = b;
      p[i] -= lr * b;
    }
  } else {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t i = 0; i < n; i++) p[i] -= lr * (g[i] + weight_decay * p[i]);
  }
  return 0;
}

static int sum_squares(const float *x, int64_t n, double *out) {
  double part[SUMSQ_RANGES];
#pragma omp parallel for schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int r = 0; r < SUMSQ_RANGES; r++) {
    int64_t lo = n * r / SUMSQ_RANGES, hi = n * (r + 1) / SUMSQ_RANGES;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
    part[r] = s;
  }
  double total = 0.0;
  for (int r = 0; r < SUMSQ_RANGES; r++) total += part[r];
  *out = total;
  return 0;
}

/* The float64 total is kept as two floats, hi + lo, so that it can be summed over ranks
** by an f32 all-reduce with little loss (about 48 bits). */
static int sum_squares_multi(const float *const *x, const int64_t *n, int count, float *out) {
  double total = 0.0;
  for (int t = 0; t < count; t++) {
    double s;
    sum_squares(x[t], n[t], &s);
    total += s;
  }
  out[0] = (float)total;
  out[1] = isfinite(total) ? (float)(total - (double)out[0]) : 0.0f;   /* inf stays inf */
  return 0;
}

static int clip_finish(const float *sumsq, int parts, float *norm, float *coef,
                       float *found_inf, double replicas, double max_norm) {
  tt_clip_finish_math(sumsq, parts, norm, coef, found_inf, replicas, max_norm);
  return 0;
}

static int scale(float *x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
  return 0;
}

static int fill(float *x, int64_t n, float value) {
  for (int64_t i = 0; i < n; i++) x[i] = value;
  return 0;
}

static int loss_flags(const float *loss, const float *limit, float *found_inf, float *spike) {
  tt_loss_flags_math(loss, limit, found_inf, spike);
  return 0;
}

const tt_optim_kernels tt_optim_cpu = {
  .adamw = adamw,
  .sgd = sgd,
  .sum_squares = sum_squares,
  .scale = scale,
  .fill = fill,
  .adamw_multi = adamw_multi,
  .sum_squares_multi = sum_squares_multi,
  .clip_finish = clip_finish,
  .loss_flags = loss_flags,
};

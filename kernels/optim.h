/*
** optim.h — kernel table of the optimizer family: in-place updates of one parameter
** tensor at a time on raw contiguous f32 buffers (not differentiable). The op layer loops
** over the parameter list; kernels parallelise within a tensor. Every entry returns 0, or
** -1 with tt_last_error() set.
**
** The multi-tensor entries (adamw_multi, sum_squares_multi, clip_finish) take a whole
** list at once and read and write their per-step scalars (gradient scale, found_inf, the
** sum of squares, the norm) in memory of the tensors' device, so that a CUDA step needs
** no host synchronisation between backward and the optimizer.
*/
#ifndef TT_KERNELS_OPTIM_H
#define TT_KERNELS_OPTIM_H
#include <math.h>
#include <stdint.h>

/* Tensors handled by one CUDA launch of the multi-tensor kernels: their pointers and
** sizes travel as kernel parameters (about 16 KiB for AdamW's table, under the 32 KiB
** that CUDA 12.1 and later allow on Volta and newer GPUs), so a Llama-1B parameter group
** is one launch; longer lists take more launches. */
enum { TT_OPTIM_MULTI_MAX = 320 };

/* Arguments of adamw_multi: count tensors, host arrays of device pointers. */
typedef struct tt_adamw_multi_args {
  float *const *p;
  const float *const *g;
  float *const *m;
  float *const *v;
  uint16_t *const *bf16;   /* NULL, or per tensor NULL or a bf16 (n[i]) copy of new p */
  const int64_t *n;
  int count;
  float lr, beta1, beta2, eps, weight_decay, bc1, bc2;
  const float *grad_scale; /* device scalar, or NULL: each g is multiplied by it first */
  const float *found_inf;  /* device scalar, or NULL: when nonzero nothing is written */
  const float *hyper;      /* device lr, bc1, bc2 (replacing the three above), or NULL */
} tt_adamw_multi_args;

typedef struct tt_optim_kernels {
  /* One AdamW step (PyTorch semantics), p, g, m, v: (n):
  **   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
  **   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)
  ** bc1 = 1 - b1^step and bc2 = 1 - b2^step are the bias corrections. */
  int (*adamw)(float *p, const float *g, float *m, float *v, int64_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, float bc1,
               float bc2);
  /* SGD with momentum (PyTorch semantics, no dampening), p, g, buf: (n):
  **   d = g + wd * p;  buf = mu * buf + d (when buf != NULL);  p -= lr * (buf or d) */
  int (*sgd)(float *p, const float *g, float *buf, int64_t n, float lr, float mu,
             float weight_decay);
  /* *out = sum of x^2 accumulated in float64, x: (n); out is host memory. The summation
  ** order is fixed (it does not depend on the thread count). */
  int (*sum_squares)(const float *x, int64_t n, double *out);
  /* x *= s, x: (n) */
  int (*scale)(float *x, int64_t n, float s);
  /* x = value, x: (n); stream-ordered on CUDA (resets the step stats without a copy). */
  int (*fill)(float *x, int64_t n, float value);
  /* adamw over every tensor of the list, with the arithmetic of adamw (the same order of
  ** operations, so the CPU results are bitwise those of one adamw call per tensor on
  ** g * grad_scale); the bf16 copies are rounded to nearest even. */
  int (*adamw_multi)(const tt_adamw_multi_args *a);
  /* out[0] + out[1] (device memory, f32 hi and lo parts) = the float64 sum over the list
  ** of the sums of squares of x[i]: (n[i]). Deterministic: fixed ranges per tensor added
  ** in a fixed order, no atomics. */
  int (*sum_squares_multi)(const float *const *x, const int64_t *n, int count, float *out);
  /* From sumsq: `parts` (hi, lo) pairs that sum_squares_multi wrote (one per rank when
  ** gathered), added in order in float64: *norm = sqrt(sum / replicas) and
  ** *coef = min(1, max_norm / (norm + 1e-6)), or 1 when max_norm <= 0 or the norm is not
  ** finite; a norm that is not finite also sets *found_inf = 1 (the update is skipped).
  ** All in device memory. */
  int (*clip_finish)(const float *sumsq, int parts, float *norm, float *coef,
                     float *found_inf, double replicas, double max_norm);
  /* The loss's verdict, in device memory: a loss that is not finite sets *found_inf; one
  ** above *limit (a spike) sets *found_inf and *spike. Either skips the update. */
  int (*loss_flags)(const float *loss, const float *limit, float *found_inf, float *spike);
} tt_optim_kernels;

extern const tt_optim_kernels tt_optim_cpu;
extern const tt_optim_kernels tt_optim_cuda __attribute__((weak));

/* clip_finish's arithmetic, one definition for the CPU entry and the CUDA kernel (which
** runs it on one thread), so the two cannot drift apart. */
#ifdef __CUDACC__
#define TT_OPTIM_HD __host__ __device__
#else
#define TT_OPTIM_HD
#endif
static inline TT_OPTIM_HD void tt_clip_finish_math(const float *sumsq, int parts, float *norm,
                                                   float *coef, float *found_inf,
                                                   double replicas, double max_norm) {
  double total = 0.0;
  for (int i = 0; i < 2 * parts; i++) total += (double)sumsq[i];
  double nrm = sqrt(total / replicas);
  double c = max_norm / (nrm + 1e-6);
  *norm = (float)nrm;
  *coef = max_norm > 0.0 && isfinite(nrm) && c < 1.0 ? (float)c : 1.0f;
  if (!isfinite(nrm)) *found_inf = 1.0f;
}

/* loss_flags' test, shared the same way. A NaN limit (never set) flags nothing. */
static inline TT_OPTIM_HD void tt_loss_flags_math(const float *loss, const float *limit,
                                                  float *found_inf, float *spike) {
  float l = *loss;
  if (!isfinite(l)) {
    *found_inf = 1.0f;
  } else if (l > *limit) {
    *found_inf = 1.0f;
    *spike = 1.0f;
  }
}

#endif

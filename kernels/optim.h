/*
** optim.h — kernel table of the optimizer family: in-place updates of one parameter
** tensor at a time on raw contiguous f32 buffers (not differentiable). The op layer loops
** over the parameter list; kernels parallelise within a tensor. Every entry returns 0, or
** -1 with tt_last_error() set.
*/
#ifndef TT_KERNELS_OPTIM_H
#define TT_KERNELS_OPTIM_H
#include <stdint.h>

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
} tt_optim_kernels;

extern const tt_optim_kernels tt_optim_cpu;
extern const tt_optim_kernels tt_optim_cuda __attribute__((weak));

#endif

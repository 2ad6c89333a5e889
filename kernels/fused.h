/*
** fused.h — kernel table of the fused memory-bound kernels of the bf16 path: residual add
** + RMSNorm or LayerNorm (+ cast), their backward with a deterministic two-stage
** weight-gradient reduction, SwiGLU and GELU, each reading and writing f32 or bf16 and
** computing in f32.
**
** These kernels move bytes, not flops: their speed is the bytes they touch over the
** device's copy bandwidth (tools/bench/kernels_cuda.c prints that ratio). Fusing the
** residual add into the norm reads x and the residual once and writes h and y once,
** where the two ops apart would read h again; bf16 halves every byte. On CUDA the rows
** are read with 128-bit loads (4 f32 or 8 bf16 values) when every row starts 16-byte
** aligned, with a scalar tail otherwise.
**
** Buffers are contiguous; `dtype` and `y_dtype` are f32 or bf16 (kernel.h codes); the
** weight and the per-row statistics are f32. Every entry returns 0, or -1 with
** tt_last_error() set.
*/
#ifndef TT_KERNELS_FUSED_H
#define TT_KERNELS_FUSED_H
#include <stdint.h>

/* Rows summed per partial of the two-stage weight-gradient reduction: stage one writes
** ceil(N / TT_FUSED_ROWS_PER_PART) partial rows of D sums, stage two adds them in order.
** The same split on every device, so the sums are deterministic (no atomics). */
enum { TT_FUSED_ROWS_PER_PART = 64 };

typedef struct tt_fused_kernels {
  /* The residual add and the norm after it, RMSNorm when mean is NULL, else LayerNorm.
  ** h = x + res (res NULL: h = x), rounded to dtype; over the rounded h, RMSNorm: rstd =
  ** 1 / sqrt(mean(h^2) + eps), y = h rstd w; LayerNorm: mean, rstd = 1 / sqrt(var + eps)
  ** (var the mean of (h - mean)^2, a second pass), y = (h - mean) rstd w + b; w NULL: 1,
  ** b NULL: 0 (RMSNorm: NULL); y rounded to y_dtype.
  ** x, res, h: (N, D) in dtype; y: (N, D) in y_dtype; w, b: (D); mean, rstd: (N). h may be
  ** NULL when res is NULL (nothing to write). */
  int (*add_norm_forward)(void *h, void *y, float *mean, float *rstd, const void *x,
                          const void *res, const float *w, const float *b, int64_t N,
                          int64_t D, float eps, int dtype, int y_dtype);
  /* Its backward. With g = dy w and xhat = (h - mean) rstd (mean 0 for RMSNorm, NULL):
  ** dh = rstd (g - mean_j(g) - xhat mean_j(g xhat)), without the mean_j(g) term for
  ** RMSNorm (+ dh_in, which may alias dh), in dtype; dw = sum over rows of dy xhat and db
  ** = sum over rows of dy, each through its half of `partials` (a workspace of 2
  ** ceil(N / TT_FUSED_ROWS_PER_PART) D floats: dw's, then db's) and one ordered
  ** reduction. dy: (N, D) in y_dtype; h, dh, dh_in: (N, D) in dtype. dh_in, dw, db may be
  ** NULL (partials too when dw and db are). */
  int (*norm_backward)(void *dh, float *dw, float *db, float *partials, const void *dy,
                       const void *dh_in, const void *h, const float *w, const float *mean,
                       const float *rstd, int64_t N, int64_t D, int dtype, int y_dtype);
  /* GELU, tanh approximation: y = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) (as
  ** kernels/activation.h's f32 kernels); n elements, all in dtype. */
  int (*gelu_forward)(void *y, const void *x, int64_t n, int dtype);
  /* dx = dy (s + 2 x s (1 - s) du/dx), s = sigmoid(2u). */
  int (*gelu_backward)(void *dx, const void *dy, const void *x, int64_t n, int dtype);
  /* y = silu(gate) * up; n elements, all in dtype. */
  int (*swiglu_forward)(void *y, const void *gate, const void *up, int64_t n, int dtype);
  /* dgate = dy up s (1 + g (1 - s)), dup = dy g s, s = sigmoid(g); either may be NULL. */
  int (*swiglu_backward)(void *dgate, void *dup, const void *dy, const void *gate,
                         const void *up, int64_t n, int dtype);
} tt_fused_kernels;

extern const tt_fused_kernels tt_fused_cpu;
extern const tt_fused_kernels tt_fused_cuda __attribute__((weak));

#endif

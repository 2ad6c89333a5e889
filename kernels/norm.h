/*
** norm.h — kernel table of the normalisation family (RMSNorm, LayerNorm over the last
** dim) on raw contiguous f32 buffers.
**
** x is viewed as N rows of D. weight and bias are (D) or NULL (then 1 and 0). The
** forward saves per-row statistics for the backward: rstd = 1 / sqrt(var + eps) (and the
** mean for LayerNorm), each (N). Backward gradient outputs are overwritten; any of them
** may be NULL when not wanted. Every entry returns 0, or -1 with tt_last_error() set.
*/
#ifndef TT_KERNELS_NORM_H
#define TT_KERNELS_NORM_H
#include <stdint.h>

typedef struct tt_norm_kernels {
  /* out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).
  ** x, out: (N, D), weight: (D) or NULL, rstd: (N) */
  int (*rmsnorm_forward)(float *out, float *rstd, const float *x, const float *weight,
                         int64_t N, int64_t D, float eps);
  /* dx: (N, D), dweight: (D) (ignored when weight is NULL), dout: (N, D) */
  int (*rmsnorm_backward)(float *dx, float *dweight, const float *dout, const float *x,
                          const float *weight, const float *rstd, int64_t N, int64_t D);
  /* out = (x - mean) * rstd * weight + bias. mean, rstd: (N) */
  int (*layernorm_forward)(float *out, float *mean, float *rstd, const float *x,
                           const float *weight, const float *bias, int64_t N, int64_t D,
                           float eps);
  /* dx: (N, D), dweight, dbias: (D) */
  int (*layernorm_backward)(float *dx, float *dweight, float *dbias, const float *dout,
                            const float *x, const float *weight, const float *mean,
                            const float *rstd, int64_t N, int64_t D);
} tt_norm_kernels;

extern const tt_norm_kernels tt_norm_cpu;
extern const tt_norm_kernels tt_norm_cuda __attribute__((weak));

#endif

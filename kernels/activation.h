/*
** activation.h — kernel table of the activation family: SiLU, GELU (tanh approximation)
** and fused SwiGLU, forward and backward, on raw contiguous f32 buffers.
**
** All buffers have n elements. Backward kernels overwrite their gradient outputs (the op
** adds them into .grad). Every entry returns 0, or -1 with tt_last_error() set.
**
** The second half of this header holds small vectorisable math helpers shared by the CPU
** kernels (kernels/cpu/activation.c and kernels/cpu/loss.c); nvcc skips them.
*/
#ifndef TT_KERNELS_ACTIVATION_H
#define TT_KERNELS_ACTIVATION_H
#include <stdint.h>
#include <string.h>

typedef struct tt_activation_kernels {
  /* y = x * sigmoid(x). x, y: (n) */
  int (*silu_forward)(float *y, const float *x, int64_t n);
  /* dx = dy * sigmoid(x) * (1 + x * (1 - sigmoid(x))). dy, x, dx: (n) */
  int (*silu_backward)(float *dx, const float *dy, const float *x, int64_t n);
  /* y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). x, y: (n) */
  int (*gelu_forward)(float *y, const float *x, int64_t n);
  int (*gelu_backward)(float *dx, const float *dy, const float *x, int64_t n);
  /* y = silu(gate) * up. gate, up, y: (n) */
  int (*swiglu_forward)(float *y, const float *gate, const float *up, int64_t n);
  /* dgate = dy * up * silu'(gate), dup = dy * silu(gate); either output may be NULL
  ** when that input needs no gradient. */
  int (*swiglu_backward)(float *dgate, float *dup, const float *dy, const float *gate,
                         const float *up, int64_t n);
} tt_activation_kernels;

extern const tt_activation_kernels tt_activation_cpu;
extern const tt_activation_kernels tt_activation_cuda __attribute__((weak));

#ifndef __CUDACC__
/* -- CPU vector math helpers --------------------------------------------------------- */

/* exp(x) for f32, written so that GCC vectorises loops calling it (libm's expf is a
** scalar call without -ffast-math). Cephes' expf scheme: x = n ln2 + r with |r| <= ln2/2,
** exp(r) by a degree-7 polynomial, 2^n built in the exponent bits. Relative error about
** 1 ulp (6e-8 measured). Inputs are clamped to [-87, 88] (results stay finite and normal);
** NaN stays NaN. */
static inline float tt_vexpf(float x) {
  const float shifter = 12582912.0f;   /* 1.5 * 2^23: x + shifter rounds to an integer */
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  float t = x * 1.44269504088896341f + shifter;
  float n = t - shifter;
  /* ln2 split in a short high part (exact product with n) and a correction */
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  uint32_t tb, sb, scale_bits;
  memcpy(&tb, &t, sizeof tb);
  memcpy(&sb, &shifter, sizeof sb);
  scale_bits = (tb - sb + 127u) << 23;   /* n in [-126, 127]: a normal power of two */
  float scale;
  memcpy(&scale, &scale_bits, sizeof scale);
  return p * scale;
}

/* 1 / (1 + exp(-x)) */
static inline float tt_vsigmoidf(float x) { return 1.0f / (1.0f + tt_vexpf(-x)); }

#endif

#endif

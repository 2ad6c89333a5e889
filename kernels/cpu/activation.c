/*
** activation.c — CPU kernels of SiLU, GELU (tanh approximation) and SwiGLU.
**
** Pure elementwise loops: each iteration is independent, so they split across threads in
** static chunks and GCC vectorises the body (tt_vexpf is branch-free). f32 throughout;
** the expressions keep their relative error near 1e-7.
*/
#include "activation.h"
#include "kernel.h"

#define GELU_K 0.7978845608028654f   /* sqrt(2 / pi) */
#define GELU_C 0.044715f

/* -- SiLU ----------------------------------------------------------------------------- */

/* x, y: (n) */
static int silu_forward(float *y, const float *x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * tt_vsigmoidf(x[i]);
  return 0;
}

/* d/dx [x s(x)] = s + x s (1 - s) */
static int silu_backward(float *dx, const float *dy, const float *x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    float s = tt_vsigmoidf(x[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
  return 0;
}

/* -- GELU (tanh approximation, as GPT-2) ----------------------------------------------- */

/* 0.5 (1 + tanh u) = sigmoid(2u), so y = x sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715
** x^3). This form has no 1 + tanh cancellation in the negative tail. */
static int gelu_forward(float *y, const float *x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = v * tt_vsigmoidf(2.0f * GELU_K * (v + GELU_C * v * v * v));
  }
  return 0;
}

/* With s = sigmoid(2u): dy/dx = s + 2 x s (1 - s) du/dx, du/dx = sqrt(2/pi) (1 + 3 *
** 0.044715 x^2) (since 1 - tanh^2 u = 4 s (1 - s)). */
static int gelu_backward(float *dx, const float *dy, const float *x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    float s = tt_vsigmoidf(2.0f * GELU_K * (v + GELU_C * v * v * v));
    float du = GELU_K * (1.0f + 3.0f * GELU_C * v * v);
    dx[i] = dy[i] * (s + 2.0f * v * s * (1.0f - s) * du);
  }
  return 0;
}

/* -- SwiGLU: silu(gate) * up, the Llama MLP nonlinearity ------------------------------- */

static int swiglu_forward(float *y, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
  for (int64_t i = 0; i < n; i++) y[i] = gate[i] * tt_vsigmoidf(gate[i]) * up[i];
  return 0;
}

static int swiglu_backward(float *dgate, float *dup, const float *dy, const float *gate,
                           const float *up, int64_t n) {
  /* Separate loops per requested output keep each one branch-free for vectorisation. */
  if (dgate && dup) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t i = 0; i < n; i++) {
      float g = gate[i], s = tt_vsigmoidf(g);
      dgate[i] = dy[i] * up[i] * s * (1.0f + g * (1.0f - s));
      dup[i] = dy[i] * g * s;
    }
  } else if (dgate) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t i = 0; i < n; i++) {
      float g = gate[i], s = tt_vsigmoidf(g);
      dgate[i] = dy[i] * up[i] * s * (1.0f + g * (1.0f - s));
    }
  } else if (dup) {
#pragma omp parallel for simd schedule(static) if (n > TT_PARALLEL_GRAIN)
    for (int64_t i = 0; i < n; i++) dup[i] = dy[i] * gate[i] * tt_vsigmoidf(gate[i]);
  }
  return 0;
}

const tt_activation_kernels tt_activation_cpu = {
  .silu_forward = silu_forward,
  .silu_backward = silu_backward,
  .gelu_forward = gelu_forward,
  .gelu_backward = gelu_backward,
  .swiglu_forward = swiglu_forward,
  .swiglu_backward = swiglu_backward,
};

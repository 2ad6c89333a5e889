/*
** activation.cu — CUDA kernels of the activation family (kernels/activation.h): SiLU,
** GELU (tanh approximation) and SwiGLU, forward and backward, on f32. Memory-bound: one
** pass, one thread per element in a grid-stride loop.
*/
#include "kernel_cuda.h"
extern "C" {
#include "activation.h"
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + __expf(-x)); }

/* GELU's tanh form and its derivative. */
__device__ __forceinline__ float gelu_f(float x) {
  const float k = 0.7978845608028654f;   /* sqrt(2 / pi) */
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float k = 0.7978845608028654f;
  float u = k * (x + 0.044715f * x * x * x);
  float t = tanhf(u);
  float du = k * (1.0f + 3.0f * 0.044715f * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

#define GRID_LOOP(i, n)                                                          \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);    \
       i += (int64_t)gridDim.x * blockDim.x)

__global__ void silu_fwd(float *y, const float *x, int64_t n) {
  GRID_LOOP(i, n) y[i] = x[i] * sigmoidf_(x[i]);
}
__global__ void silu_bwd(float *dx, const float *dy, const float *x, int64_t n) {
  GRID_LOOP(i, n) {
    float s = sigmoidf_(x[i]);
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}
__global__ void gelu_fwd(float *y, const float *x, int64_t n) { GRID_LOOP(i, n) y[i] = gelu_f(x[i]); }
__global__ void gelu_bwd(float *dx, const float *dy, const float *x, int64_t n) {
  GRID_LOOP(i, n) dx[i] = dy[i] * gelu_grad(x[i]);
}
__global__ void swiglu_fwd(float *y, const float *gate, const float *up, int64_t n) {
  GRID_LOOP(i, n) y[i] = gate[i] * sigmoidf_(gate[i]) * up[i];
}
__global__ void swiglu_bwd(float *dgate, float *dup, const float *dy, const float *gate,
                           const float *up, int64_t n) {
  GRID_LOOP(i, n) {
    float g = gate[i], s = sigmoidf_(g);
    if (dgate) dgate[i] = dy[i] * up[i] * s * (1.0f + g * (1.0f - s));
    if (dup) dup[i] = dy[i] * g * s;
  }
}

#define LAUNCH(kernel, n, ...)                                                       \
  do {                                                                               \
    if ((n) == 0) return 0;                                                          \
    kernel<<<tt_cuda_blocks((n), 256), 256, 0, tt_cuda_cur_stream()>>>(__VA_ARGS__);     \
    TT_CU_LAUNCHED(#kernel);                                                         \
    return 0;                                                                        \
  } while (0)

static int silu_forward(float *y, const float *x, int64_t n) { LAUNCH(silu_fwd, n, y, x, n); }
static int silu_backward(float *dx, const float *dy, const float *x, int64_t n) {
  LAUNCH(silu_bwd, n, dx, dy, x, n);
}
static int gelu_forward(float *y, const float *x, int64_t n) { LAUNCH(gelu_fwd, n, y, x, n); }
static int gelu_backward(float *dx, const float *dy, const float *x, int64_t n) {
  LAUNCH(gelu_bwd, n, dx, dy, x, n);
}
static int swiglu_forward(float *y, const float *gate, const float *up, int64_t n) {
  LAUNCH(swiglu_fwd, n, y, gate, up, n);
}
static int swiglu_backward(float *dgate, float *dup, const float *dy, const float *gate,
                           const float *up, int64_t n) {
  if (!dgate && !dup) return 0;
  LAUNCH(swiglu_bwd, n, dgate, dup, dy, gate, up, n);
}

extern "C" const tt_activation_kernels tt_activation_cuda = {
  silu_forward, silu_backward, gelu_forward, gelu_backward, swiglu_forward, swiglu_backward,
};

TT_CUDA_FAMILY(activation)

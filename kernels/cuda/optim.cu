/*
** optim.cu — CUDA kernels of the optimizer family (kernels/optim.h): AdamW and SGD
** updates, the float64 sum of squares behind the gradient norm, and in-place scaling.
**
** The sum of squares is deterministic: a fixed grid of SUMSQ_BLOCKS blocks (not sized by
** the device) writes one float64 partial each, and one block adds the partials in order.
*/
#include "cuda/tt_cuda.h"
extern "C" {
#include "optim.h"
}

enum { SUMSQ_BLOCKS = 264, SUMSQ_THREADS = 512 };

#define GRID_LOOP(i, n)                                                          \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);    \
       i += (int64_t)gridDim.x * blockDim.x)

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, int64_t n,
                             float lr, float b1, float b2, float eps, float wd, float bc1,
                             float bc2) {
  GRID_LOOP(i, n) {
    float gi = g[i], pi = p[i];
    pi -= lr * wd * pi;
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
  }
}

static int adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                 float beta1, float beta2, float eps, float weight_decay, float bc1,
                 float bc2) {
  if (n == 0) return 0;
  adamw_kernel<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(
      p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
  TT_CU_LAUNCHED("adamw_kernel");
  return 0;
}

__global__ void sgd_kernel(float *p, const float *g, float *buf, int64_t n, float lr,
                           float mu, float wd) {
  GRID_LOOP(i, n) {
    float d = g[i] + wd * p[i];
    if (buf) {
      buf[i] = mu * buf[i] + d;
      d = buf[i];
    }
    p[i] -= lr * d;
  }
}

static int sgd(float *p, const float *g, float *buf, int64_t n, float lr, float mu,
               float weight_decay) {
  if (n == 0) return 0;
  sgd_kernel<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(p, g, buf, n, lr, mu,
                                                                   weight_decay);
  TT_CU_LAUNCHED("sgd_kernel");
  return 0;
}

__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Block sum in float64 (the shuffle order is fixed, so the result is too). */
__device__ double block_sum_d(double v) {
  __shared__ double scratch[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_d(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.0;
  return warp_sum_d(v);
}

__global__ void sumsq_partial(const float *x, int64_t n, double *partial) {
  double s = 0;
  GRID_LOOP(i, n) s += (double)x[i] * (double)x[i];
  s = block_sum_d(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sumsq_final(double *partial, int nparts) {
  double s = 0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partial[i];
  s = block_sum_d(s);
  if (threadIdx.x == 0) partial[0] = s;
}

static int sum_squares(const float *x, int64_t n, double *out) {
  *out = 0;
  if (n == 0) return 0;
  cudaStream_t st = tt_cuda_cur_stream();
  double *partial = NULL;
  TT_CU(cudaMallocAsync((void **)&partial, sizeof(double) * SUMSQ_BLOCKS, st));
  sumsq_partial<<<SUMSQ_BLOCKS, SUMSQ_THREADS, 0, st>>>(x, n, partial);
  sumsq_final<<<1, SUMSQ_THREADS, 0, st>>>(partial, SUMSQ_BLOCKS);
  cudaError_t e = tt_cuda_launch_status();
  if (e == cudaSuccess) e = cudaMemcpyAsync(out, partial, sizeof(double), cudaMemcpyDeviceToHost, st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(st);
  cudaFreeAsync(partial, st);
  TT_CU(e);
  return 0;
}

__global__ void scale_kernel(float *x, int64_t n, float s) { GRID_LOOP(i, n) x[i] *= s; }

static int scale(float *x, int64_t n, float s) {
  if (n == 0) return 0;
  scale_kernel<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(x, n, s);
  TT_CU_LAUNCHED("scale_kernel");
  return 0;
}

extern "C" const tt_optim_kernels tt_optim_cuda = {
  adamw, sgd, sum_squares, scale,
};

TT_CUDA_FAMILY(optim)

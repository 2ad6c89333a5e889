/*
** norm.cu — CUDA kernels of the normalisation family (kernels/norm.h): RMSNorm and
** LayerNorm over the last dim, forward and backward, f32.
**
** One block per row for the row-wise parts (statistics, dx); the weight and bias
** gradients sum over rows, which a second kernel does column by column (each thread one
** column, rows in order): deterministic, without atomics.
*/
#include "kernel_cuda.h"
extern "C" {
#include "norm.h"
}

enum { NORM_THREADS = 256 };

/* rstd = 1 / sqrt(mean(x^2) + eps); out = x * rstd * w */
__global__ void rms_fwd(float *out, float *rstd, const float *x, const float *w, int64_t D,
                        float eps) {
  __shared__ float scratch[32];
  const float *xr = x + blockIdx.x * D;
  float ss = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) ss += xr[j] * xr[j];
  ss = tt_block_sum(ss, scratch);
  float r = rsqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  float *o = out + blockIdx.x * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) o[j] = xr[j] * r * (w ? w[j] : 1.0f);
}

/* dx = r * (dy w) - x r^3 / D * sum(dy w x) */
__global__ void rms_bwd_dx(float *dx, const float *dout, const float *x, const float *w,
                           const float *rstd, int64_t D) {
  __shared__ float scratch[32];
  const float *xr = x + blockIdx.x * D, *gr = dout + blockIdx.x * D;
  float r = rstd[blockIdx.x], dot = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dot += gr[j] * (w ? w[j] : 1.0f) * xr[j];
  dot = tt_block_sum(dot, scratch);
  float c = dot * r * r * r / (float)D;
  float *o = dx + blockIdx.x * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    o[j] = r * gr[j] * (w ? w[j] : 1.0f) - xr[j] * c;
}

/* dw[j] = sum_rows dy * xhat, db[j] = sum_rows dy; xhat = (x - mean) * rstd. */
__global__ void norm_bwd_params(float *dw, float *db, const float *dout, const float *x,
                                const float *mean, const float *rstd, int64_t N, int64_t D) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D) return;
  float sw = 0, sb = 0;
  for (int64_t i = 0; i < N; i++) {
    float g = dout[i * D + j];
    sw += g * (x[i * D + j] - (mean ? mean[i] : 0.0f)) * rstd[i];
    sb += g;
  }
  if (dw) dw[j] = sw;
  if (db) db[j] = sb;
}

static int rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight,
                           int64_t N, int64_t D, float eps) {
  if (N == 0) return 0;
  TT_CHECK(N <= 0x7fffffff, "rmsnorm: %lld rows is too many for one launch", (long long)N);
  rms_fwd<<<(unsigned)N, NORM_THREADS, 0, tt_cuda_cur_stream()>>>(out, rstd, x, weight, D, eps);
  TT_CU_LAUNCHED("rms_fwd");
  return 0;
}

static int rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                            const float *weight, const float *rstd, int64_t N, int64_t D) {
  if (N == 0) return 0;
  if (dx) {
    rms_bwd_dx<<<(unsigned)N, NORM_THREADS, 0, tt_cuda_cur_stream()>>>(dx, dout, x, weight, rstd, D);
    TT_CU_LAUNCHED("rms_bwd_dx");
  }
  if (dweight && weight) {
    norm_bwd_params<<<(unsigned)((D + 127) / 128), 128, 0, tt_cuda_cur_stream()>>>(
        dweight, NULL, dout, x, NULL, rstd, N, D);
    TT_CU_LAUNCHED("norm_bwd_params");
  }
  return 0;
}

/* Two-pass statistics (mean, then the variance around it) for accuracy with a large mean. */
__global__ void ln_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                       const float *b, int64_t D, float eps) {
  __shared__ float scratch[32];
  const float *xr = x + blockIdx.x * D;
  float s = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += xr[j];
  float mu = tt_block_sum(s, scratch) / (float)D;
  float v = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) v += (xr[j] - mu) * (xr[j] - mu);
  float r = rsqrtf(tt_block_sum(v, scratch) / (float)D + eps);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = mu;
    rstd[blockIdx.x] = r;
  }
  float *o = out + blockIdx.x * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    o[j] = (xr[j] - mu) * r * (w ? w[j] : 1.0f) + (b ? b[j] : 0.0f);
}

/* dx = r * (g - mean(g) - xhat * mean(g xhat)), g = dy w */
__global__ void ln_bwd_dx(float *dx, const float *dout, const float *x, const float *w,
                          const float *mean, const float *rstd, int64_t D) {
  __shared__ float scratch[32];
  const float *xr = x + blockIdx.x * D, *gr = dout + blockIdx.x * D;
  float mu = mean[blockIdx.x], r = rstd[blockIdx.x], sg = 0, sgx = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float g = gr[j] * (w ? w[j] : 1.0f);
    sg += g;
    sgx += g * (xr[j] - mu) * r;
  }
  sg = tt_block_sum(sg, scratch) / (float)D;
  sgx = tt_block_sum(sgx, scratch) / (float)D;
  float *o = dx + blockIdx.x * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float g = gr[j] * (w ? w[j] : 1.0f), xh = (xr[j] - mu) * r;
    o[j] = r * (g - sg - xh * sgx);
  }
}

static int layernorm_forward(float *out, float *mean, float *rstd, const float *x,
                             const float *weight, const float *bias, int64_t N, int64_t D,
                             float eps) {
  if (N == 0) return 0;
  TT_CHECK(N <= 0x7fffffff, "layernorm: %lld rows is too many for one launch", (long long)N);
  ln_fwd<<<(unsigned)N, NORM_THREADS, 0, tt_cuda_cur_stream()>>>(out, mean, rstd, x, weight, bias,
                                                             D, eps);
  TT_CU_LAUNCHED("ln_fwd");
  return 0;
}

static int layernorm_backward(float *dx, float *dweight, float *dbias, const float *dout,
                              const float *x, const float *weight, const float *mean,
                              const float *rstd, int64_t N, int64_t D) {
  if (N == 0) return 0;
  if (dx) {
    ln_bwd_dx<<<(unsigned)N, NORM_THREADS, 0, tt_cuda_cur_stream()>>>(dx, dout, x, weight, mean,
                                                                  rstd, D);
    TT_CU_LAUNCHED("ln_bwd_dx");
  }
  if (dweight || dbias) {
    norm_bwd_params<<<(unsigned)((D + 127) / 128), 128, 0, tt_cuda_cur_stream()>>>(
        weight ? dweight : NULL, dbias, dout, x, mean, rstd, N, D);
    TT_CU_LAUNCHED("norm_bwd_params");
  }
  return 0;
}

extern "C" const tt_norm_kernels tt_norm_cuda = {
  rmsnorm_forward, rmsnorm_backward, layernorm_forward, layernorm_backward,
};

TT_CUDA_FAMILY(norm)

/*
** optim.cu — CUDA kernels of the optimizer family (kernels/optim.h): AdamW and SGD
** updates, the float64 sum of squares behind the gradient norm, and in-place scaling.
**
** The sum of squares is deterministic: a fixed grid of SUMSQ_BLOCKS blocks (not sized by
** the device) writes one float64 partial each, and one block adds the partials in order.
**
** The multi-tensor kernels (adamw_multi, sum_squares_multi) cut every tensor of a list into
** chunks of MT_CHUNK elements and give each block one chunk; the table of tensors (up to
** TT_OPTIM_MULTI_MAX per launch) and the first chunk of each travel as kernel parameters,
** so a launch needs no copy to the device, and a step captured in a CUDA graph keeps them.
** Their scalars (gradient scale, found_inf, the sum of squares, the norm) stay in device
** memory: nothing here waits for the device.
*/
#include "kernel_cuda.h"
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
  if (e == cudaSuccess) e = tt_cuda_host_wait(st);
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

__global__ void fill_kernel(float *x, int64_t n, float value) { GRID_LOOP(i, n) x[i] = value; }

static int fill(float *x, int64_t n, float value) {
  if (n == 0) return 0;
  fill_kernel<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(x, n, value);
  TT_CU_LAUNCHED("fill_kernel");
  return 0;
}

/* -- Multi-tensor kernels ------------------------------------------------------------ */

enum { MT_CHUNK = 65536, MT_THREADS = 512, MT_FINAL_THREADS = 1024 };

/* Up to TT_OPTIM_MULTI_MAX tensors of one launch; chunk0[t] is the first block of tensor t
** and chunk0[count] the grid size. */
struct mt_table {
  int64_t n[TT_OPTIM_MULTI_MAX];
  int chunk0[TT_OPTIM_MULTI_MAX + 1];
  int count;
};

struct adamw_table {
  mt_table t;
  float *p[TT_OPTIM_MULTI_MAX];
  const float *g[TT_OPTIM_MULTI_MAX];
  float *m[TT_OPTIM_MULTI_MAX];
  float *v[TT_OPTIM_MULTI_MAX];
  __nv_bfloat16 *bf16[TT_OPTIM_MULTI_MAX];
};

struct sumsq_table {
  mt_table t;
  const float *x[TT_OPTIM_MULTI_MAX];
};

/* The tensor that block b works on (binary search of chunk0), and its element range. */
__device__ __forceinline__ int mt_locate(const mt_table &t, int64_t *lo, int64_t *hi) {
  int b = blockIdx.x, a = 0, z = t.count - 1;
  while (a < z) {
    int mid = (a + z + 1) / 2;
    if (t.chunk0[mid] <= b) a = mid; else z = mid - 1;
  }
  *lo = (int64_t)(b - t.chunk0[a]) * MT_CHUNK;
  *hi = min(t.n[a], *lo + MT_CHUNK);
  return a;
}

/* Fills the size part of a table for tensors [first, first + count) of n; returns the
** number of blocks (0 when every tensor is empty). */
static int mt_fill(mt_table *t, const int64_t *n, int first, int count) {
  int blocks = 0;
  t->count = count;
  for (int i = 0; i < count; i++) {
    t->n[i] = n[first + i];
    t->chunk0[i] = blocks;
    blocks += (int)((n[first + i] + MT_CHUNK - 1) / MT_CHUNK);
  }
  t->chunk0[count] = blocks;
  return blocks;
}

/* The arithmetic of adamw_kernel's CPU twin (kernels/cpu/optim.c), element by element. */
__global__ void adamw_multi_kernel(adamw_table tab, float lr, float b1, float b2, float eps,
                                   float wd, float bc1, float bc2, const float *gscale,
                                   const float *found_inf, const float *hyper) {
  if (found_inf && *found_inf != 0.0f) return;
  if (hyper) {
    lr = hyper[0];
    bc1 = hyper[1];
    bc2 = hyper[2];
  }
  int64_t lo, hi;
  int t = mt_locate(tab.t, &lo, &hi);
  float *p = tab.p[t], *m = tab.m[t], *v = tab.v[t];
  const float *g = tab.g[t];
  __nv_bfloat16 *out = tab.bf16[t];
  float decay = 1.0f - lr * wd, step = lr / bc1, inv_sqrt_bc2 = 1.0f / sqrtf(bc2);
  float s = gscale ? *gscale : 1.0f;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float gi = gscale ? g[i] * s : g[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i] * decay - step * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    p[i] = pi;
    if (out) out[i] = __float2bfloat16_rn(pi);
  }
}

static int adamw_multi(const tt_adamw_multi_args *a) {
  cudaStream_t st = tt_cuda_cur_stream();
  for (int first = 0; first < a->count; first += TT_OPTIM_MULTI_MAX) {
    int count = a->count - first < TT_OPTIM_MULTI_MAX ? a->count - first : TT_OPTIM_MULTI_MAX;
    adamw_table tab;
    int blocks = mt_fill(&tab.t, a->n, first, count);
    if (blocks == 0) continue;
    for (int i = 0; i < count; i++) {
      tab.p[i] = a->p[first + i];
      tab.g[i] = a->g[first + i];
      tab.m[i] = a->m[first + i];
      tab.v[i] = a->v[first + i];
      tab.bf16[i] = a->bf16 ? (__nv_bfloat16 *)a->bf16[first + i] : NULL;
    }
    adamw_multi_kernel<<<blocks, MT_THREADS, 0, st>>>(tab, a->lr, a->beta1, a->beta2, a->eps,
                                                      a->weight_decay, a->bc1, a->bc2,
                                                      a->grad_scale, a->found_inf, a->hyper);
    TT_CU_LAUNCHED("adamw_multi_kernel");
  }
  return 0;
}

/* One float64 partial per chunk, at partial[first_block + blockIdx.x]. */
__global__ void sumsq_multi_kernel(sumsq_table tab, double *partial) {
  int64_t lo, hi;
  const float *x = tab.x[mt_locate(tab.t, &lo, &hi)];
  double s = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += (double)x[i] * (double)x[i];
  s = block_sum_d(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* out = {hi, lo} of the sum of the partials, each thread taking a fixed stride. */
__global__ void sumsq_multi_final(const double *partial, int64_t nparts, float *out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < nparts; i += blockDim.x) s += partial[i];
  s = block_sum_d(s);
  if (threadIdx.x == 0) {
    float h = (float)s;
    out[0] = h;
    out[1] = isfinite(s) ? (float)(s - (double)h) : 0.0f;   /* inf stays inf */
  }
}

static int sum_squares_multi(const float *const *x, const int64_t *n, int count, float *out) {
  cudaStream_t st = tt_cuda_cur_stream();
  int64_t total = 0;
  for (int i = 0; i < count; i++) total += (n[i] + MT_CHUNK - 1) / MT_CHUNK;
  double *partial = NULL;
  TT_CU(cudaMallocAsync((void **)&partial, sizeof(double) * (total > 0 ? total : 1), st));
  cudaError_t e = cudaSuccess;
  int64_t done = 0;
  for (int first = 0; first < count && e == cudaSuccess; first += TT_OPTIM_MULTI_MAX) {
    int c = count - first < TT_OPTIM_MULTI_MAX ? count - first : TT_OPTIM_MULTI_MAX;
    sumsq_table tab;
    int blocks = mt_fill(&tab.t, n, first, c);
    if (blocks == 0) continue;
    for (int i = 0; i < c; i++) tab.x[i] = x[first + i];
    sumsq_multi_kernel<<<blocks, MT_THREADS, 0, st>>>(tab, partial + done);
    e = tt_cuda_launch_status();
    done += blocks;
  }
  if (e == cudaSuccess) {
    sumsq_multi_final<<<1, MT_FINAL_THREADS, 0, st>>>(partial, done, out);
    e = tt_cuda_launch_status();
  }
  cudaFreeAsync(partial, st);
  TT_CU(e);
  return 0;
}

__global__ void clip_finish_kernel(const float *sumsq, int parts, float *norm, float *coef,
                                   float *found_inf, double replicas, double max_norm) {
  tt_clip_finish_math(sumsq, parts, norm, coef, found_inf, replicas, max_norm);
}

static int clip_finish(const float *sumsq, int parts, float *norm, float *coef,
                       float *found_inf, double replicas, double max_norm) {
  clip_finish_kernel<<<1, 1, 0, tt_cuda_cur_stream()>>>(sumsq, parts, norm, coef, found_inf,
                                                          replicas, max_norm);
  TT_CU_LAUNCHED("clip_finish_kernel");
  return 0;
}

__global__ void loss_flags_kernel(const float *loss, const float *limit, float *found_inf,
                                  float *spike) {
  tt_loss_flags_math(loss, limit, found_inf, spike);
}

static int loss_flags(const float *loss, const float *limit, float *found_inf, float *spike) {
  loss_flags_kernel<<<1, 1, 0, tt_cuda_cur_stream()>>>(loss, limit, found_inf, spike);
  TT_CU_LAUNCHED("loss_flags_kernel");
  return 0;
}

extern "C" const tt_optim_kernels tt_optim_cuda = {
  adamw, sgd, sum_squares, scale, fill, adamw_multi, sum_squares_multi, clip_finish,
  loss_flags,
};

TT_CUDA_FAMILY(optim)

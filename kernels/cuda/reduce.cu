/*
** reduce.cu — CUDA kernels of the reduction family (kernels/reduce.h): sum, max with its
** index, softmax, and their backward, over the middle dim of (outer, r, inner), f32.
**
** Two shapes of work: inner == 1 (reducing the last dim, the common case) gives one
** block per row with a block reduction; otherwise one thread per (outer, inner) column
** walks r, which keeps the loads coalesced across the inner dim.
*/
#include "kernel_cuda.h"
extern "C" {
#include "reduce.h"
}

enum { ROW_THREADS = 256 };

#define GRID_LOOP(i, n)                                                          \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);    \
       i += (int64_t)gridDim.x * blockDim.x)

/* -- sum ---------------------------------------------------------------------------- */

__global__ void sum_rows(float *out, const float *x, int64_t r, float scale) {
  __shared__ float scratch[32];
  const float *row = x + blockIdx.x * r;
  float s = 0;
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x) s += row[j];
  s = tt_block_sum(s, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = s * scale;
}

__global__ void sum_cols(float *out, const float *x, int64_t outer, int64_t r, int64_t inner,
                         float scale) {
  GRID_LOOP(k, outer * inner) {
    int64_t o = k / inner, i = k % inner;
    const float *p = x + o * r * inner + i;
    float s = 0;
    for (int64_t j = 0; j < r; j++) s += p[j * inner];
    out[k] = s * scale;
  }
}

static int sum(float *out, const float *x, int64_t outer, int64_t r, int64_t inner,
               float scale) {
  if (outer * inner == 0) return 0;
  if (inner == 1 && outer <= 0x7fffffff) {
    sum_rows<<<(unsigned)outer, ROW_THREADS, 0, tt_cuda_cur_stream()>>>(out, x, r, scale);
    TT_CU_LAUNCHED("sum_rows");
  } else {
    sum_cols<<<tt_cuda_blocks(outer * inner, 256), 256, 0, tt_cuda_cur_stream()>>>(out, x, outer, r,
                                                                               inner, scale);
    TT_CU_LAUNCHED("sum_cols");
  }
  return 0;
}

__global__ void sum_bwd(float *gx, const float *g, int64_t outer, int64_t r, int64_t inner,
                        float scale) {
  GRID_LOOP(k, outer * r * inner) {
    int64_t i = k % inner, o = k / (r * inner);
    gx[k] = g[o * inner + i] * scale;
  }
}

static int sum_backward(float *gx, const float *g, int64_t outer, int64_t r, int64_t inner,
                        float scale) {
  int64_t n = outer * r * inner;
  if (n == 0) return 0;
  sum_bwd<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(gx, g, outer, r, inner, scale);
  TT_CU_LAUNCHED("sum_bwd");
  return 0;
}

/* -- max ---------------------------------------------------------------------------- */

/* a beats b when larger, or NaN (a NaN is the maximum), ties go to the smaller index. */
__device__ __forceinline__ bool beats(float a, int64_t ia, float b, int64_t ib) {
  bool an = isnan(a), bn = isnan(b);
  if (an != bn) return an;
  if (an || a == b) return ia < ib;
  return a > b;
}

__global__ void max_cols(float *out, int64_t *idx, const float *x, int64_t outer, int64_t r,
                         int64_t inner) {
  GRID_LOOP(k, outer * inner) {
    int64_t o = k / inner, i = k % inner;
    const float *p = x + o * r * inner + i;
    float best = p[0];
    int64_t bi = 0;
    for (int64_t j = 1; j < r; j++)
      if (beats(p[j * inner], j, best, bi)) { best = p[j * inner]; bi = j; }
    out[k] = best;
    idx[k] = bi;
  }
}

__global__ void max_rows(float *out, int64_t *idx, const float *x, int64_t r) {
  __shared__ float sv[ROW_THREADS];
  __shared__ int64_t si[ROW_THREADS];
  const float *row = x + blockIdx.x * r;
  float best = row[0];
  int64_t bi = 0;
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x)
    if (beats(row[j], j, best, bi)) { best = row[j]; bi = j; }
  sv[threadIdx.x] = best;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w && beats(sv[threadIdx.x + w], si[threadIdx.x + w], sv[threadIdx.x],
                                      si[threadIdx.x])) {
      sv[threadIdx.x] = sv[threadIdx.x + w];
      si[threadIdx.x] = si[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[blockIdx.x] = sv[0];
    idx[blockIdx.x] = si[0];
  }
}

static int max_(float *out, int64_t *idx, const float *x, int64_t outer, int64_t r,
                int64_t inner) {
  TT_CHECK(r >= 1, "max: reducing an empty dim");
  if (outer * inner == 0) return 0;
  if (inner == 1 && outer <= 0x7fffffff) {
    max_rows<<<(unsigned)outer, ROW_THREADS, 0, tt_cuda_cur_stream()>>>(out, idx, x, r);
    TT_CU_LAUNCHED("max_rows");
  } else {
    max_cols<<<tt_cuda_blocks(outer * inner, 256), 256, 0, tt_cuda_cur_stream()>>>(out, idx, x,
                                                                               outer, r, inner);
    TT_CU_LAUNCHED("max_cols");
  }
  return 0;
}

__global__ void max_bwd(float *gx, const float *g, const int64_t *idx, int64_t outer,
                        int64_t r, int64_t inner) {
  GRID_LOOP(k, outer * r * inner) {
    int64_t i = k % inner, j = (k / inner) % r, o = k / (r * inner);
    gx[k] = idx[o * inner + i] == j ? g[o * inner + i] : 0.0f;
  }
}

static int max_backward(float *gx, const float *g, const int64_t *idx, int64_t outer,
                        int64_t r, int64_t inner) {
  int64_t n = outer * r * inner;
  if (n == 0) return 0;
  max_bwd<<<tt_cuda_blocks(n, 256), 256, 0, tt_cuda_cur_stream()>>>(gx, g, idx, outer, r, inner);
  TT_CU_LAUNCHED("max_bwd");
  return 0;
}

/* -- softmax ------------------------------------------------------------------------ */

__global__ void softmax_rows(float *y, const float *x, int64_t r) {
  __shared__ float scratch[32];
  const float *row = x + blockIdx.x * r;
  float *out = y + blockIdx.x * r;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x) m = fmaxf(m, row[j]);
  m = tt_block_max(m, scratch);
  float s = 0;
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x) s += __expf(row[j] - m);
  s = tt_block_sum(s, scratch);
  float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x) out[j] = __expf(row[j] - m) * inv;
}

__global__ void softmax_cols(float *y, const float *x, int64_t outer, int64_t r, int64_t inner) {
  GRID_LOOP(k, outer * inner) {
    int64_t o = k / inner, i = k % inner;
    const float *p = x + o * r * inner + i;
    float *q = y + o * r * inner + i;
    float m = -INFINITY, s = 0;
    for (int64_t j = 0; j < r; j++) m = fmaxf(m, p[j * inner]);
    for (int64_t j = 0; j < r; j++) s += __expf(p[j * inner] - m);
    for (int64_t j = 0; j < r; j++) q[j * inner] = __expf(p[j * inner] - m) / s;
  }
}

static int softmax(float *y, const float *x, int64_t outer, int64_t r, int64_t inner) {
  if (outer * r * inner == 0) return 0;
  if (inner == 1 && outer <= 0x7fffffff) {
    softmax_rows<<<(unsigned)outer, ROW_THREADS, 0, tt_cuda_cur_stream()>>>(y, x, r);
    TT_CU_LAUNCHED("softmax_rows");
  } else {
    softmax_cols<<<tt_cuda_blocks(outer * inner, 256), 256, 0, tt_cuda_cur_stream()>>>(y, x, outer,
                                                                                   r, inner);
    TT_CU_LAUNCHED("softmax_cols");
  }
  return 0;
}

__global__ void softmax_bwd_rows(float *gx, const float *g, const float *y, int64_t r) {
  __shared__ float scratch[32];
  int64_t base = blockIdx.x * r;
  float d = 0;
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x) d += g[base + j] * y[base + j];
  d = tt_block_sum(d, scratch);
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x)
    gx[base + j] = y[base + j] * (g[base + j] - d);
}

__global__ void softmax_bwd_cols(float *gx, const float *g, const float *y, int64_t outer,
                                 int64_t r, int64_t inner) {
  GRID_LOOP(k, outer * inner) {
    int64_t o = k / inner, i = k % inner, base = o * r * inner + i;
    float d = 0;
    for (int64_t j = 0; j < r; j++) d += g[base + j * inner] * y[base + j * inner];
    for (int64_t j = 0; j < r; j++)
      gx[base + j * inner] = y[base + j * inner] * (g[base + j * inner] - d);
  }
}

static int softmax_backward(float *gx, const float *g, const float *y, int64_t outer,
                            int64_t r, int64_t inner) {
  if (outer * r * inner == 0) return 0;
  if (inner == 1 && outer <= 0x7fffffff) {
    softmax_bwd_rows<<<(unsigned)outer, ROW_THREADS, 0, tt_cuda_cur_stream()>>>(gx, g, y, r);
    TT_CU_LAUNCHED("softmax_bwd_rows");
  } else {
    softmax_bwd_cols<<<tt_cuda_blocks(outer * inner, 256), 256, 0, tt_cuda_cur_stream()>>>(
        gx, g, y, outer, r, inner);
    TT_CU_LAUNCHED("softmax_bwd_cols");
  }
  return 0;
}

extern "C" const tt_reduce_kernels tt_reduce_cuda = {
  sum, sum_backward, max_, max_backward, softmax, softmax_backward,
};

TT_CUDA_FAMILY(reduce)
